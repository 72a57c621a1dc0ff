// OMS bundles (oms.h): model.sig read, verified with OpenSSL's EVP against trusted EC keys, and
// its statement held against the artifact's files, as artifact/oms.py does through the
// `model-signing` library.
#include "oms.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <initializer_list>
#include <map>
#include <memory>

#include "files.h"
#include "json.h"
#include "templates.h"

namespace aotc::fe {

namespace {

using Type = json::Value::Type;
const char* kMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json";
const char* kMediaTypes[] = {"application/vnd.dev.sigstore.bundle+json;version=0.1",
                             "application/vnd.dev.sigstore.bundle+json;version=0.2",
                             "application/vnd.dev.sigstore.bundle+json;version=0.3", kMediaType};
const char* kPayloadType = "application/vnd.in-toto+json";
const char* kStatementType = "https://in-toto.io/Statement/v1";
const char* kPredicateType = "https://model_signing/signature/v1.0";
const std::vector<std::string> kGitPaths = {".git", ".gitattributes", ".github", ".gitignore"};

struct Failure {   // one key's check failed (artifact/oms.py: the library raised); say why
  std::string why;
};

const json::Value* member(const json::Value& v, const char* key) {
  if (v.type != Type::Object) return nullptr;
  for (const auto& [k, m] : v.members)
    if (k == key) return m.type == Type::Null ? nullptr : &m;
  return nullptr;
}

const std::string& str(const json::Value* v, const char* what) {
  if (!v || v->type != Type::String) throw Failure{std::string("no string ") + what};
  return v->s;
}

std::string cut(std::string s, size_t n) { return s.size() > n ? s.substr(0, n) : s; }

// ----------------------------------------------------------------------------- the bundle
struct Bundle {
  std::string media_type, hint, payload, payload_type, sig;
  std::vector<std::string> chain;   // the certificate method's certificates (DER), signer first
  bool has_key = false, has_envelope = false, has_sig = false, tlog = false;
};

[[noreturn]] void malformed(const std::string& where, const std::string& found) {
  raise<ArtifactError>(rules::kOmsMalformed, {{"where", where}, {"found", found}});
}

// An object whose members are all `allowed` (the library's models forbid others).
const json::Value& object(const json::Value* v, const char* name, std::initializer_list<const char*> allowed,
                          const std::string& where) {
  if (!v || v->type != Type::Object) malformed(where, std::string(name) + " is not an object");
  for (const auto& [k, m] : v->members)
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }))
      malformed(where, std::string(name) + " has an unknown field " + json::dump(k));
  return *v;
}

std::string b64(const json::Value* v, const char* name, const std::string& where) {
  std::string out;
  if (!v || v->type != Type::String || !b64decode_strict(v->s, out))
    malformed(where, std::string(name) + " is not base64 text");
  return out;
}

void read_material(const json::Value& doc, Bundle& b, const std::string& where) {
  const json::Value& vm = object(member(doc, "verificationMaterial"), "verificationMaterial",
                                 {"publicKey", "x509CertificateChain", "certificate", "tlogEntries",
                                  "timestampVerificationData"}, where);
  const json::Value* key = member(vm, "publicKey");
  const json::Value* chain = member(vm, "x509CertificateChain");
  if ((key != nullptr) + (chain != nullptr) + (member(vm, "certificate") != nullptr) != 1)
    malformed(where, "not exactly one of publicKey, x509CertificateChain, certificate");
  if (key) {
    const json::Value* hint = member(object(key, "publicKey", {"hint", "rawBytes", "keyDetails"}, where), "hint");
    if (hint && hint->type != Type::String) malformed(where, "publicKey.hint is not a string");
    b.has_key = true, b.hint = hint ? hint->s : "";
  }
  if (chain) {
    const json::Value* certs = member(object(chain, "x509CertificateChain", {"certificates"}, where), "certificates");
    if (!certs || certs->type != Type::Array) malformed(where, "x509CertificateChain.certificates is not a list");
    for (const json::Value& c : certs->items)
      b.chain.push_back(b64(member(object(&c, "a certificate", {"rawBytes"}, where), "rawBytes"),
                            "a certificate's rawBytes", where));
  }
  const json::Value* tlog = member(vm, "tlogEntries");
  if (tlog && tlog->type != Type::Array) malformed(where, "tlogEntries is not a list");
  b.tlog = tlog && !tlog->items.empty();
}

void read_envelope(const json::Value& doc, Bundle& b, const std::string& where) {
  const json::Value* env = member(doc, "dsseEnvelope");
  if ((env != nullptr) + (member(doc, "messageSignature") != nullptr) != 1)
    malformed(where, "not exactly one of messageSignature, dsseEnvelope");
  if (!env) return;
  object(env, "dsseEnvelope", {"payload", "payloadType", "signatures"}, where);
  b.has_envelope = true;
  b.payload = b64(member(*env, "payload"), "dsseEnvelope.payload", where);
  const json::Value* type = member(*env, "payloadType");
  const json::Value* sigs = member(*env, "signatures");
  if (!type || type->type != Type::String) malformed(where, "dsseEnvelope.payloadType is not a string");
  if (!sigs || sigs->type != Type::Array) malformed(where, "dsseEnvelope.signatures is not a list");
  b.payload_type = type->s;
  for (const json::Value& s : sigs->items) {
    object(&s, "a signature", {"sig", "keyid"}, where);
    const json::Value* id = member(s, "keyid");
    if (id && id->type != Type::String) malformed(where, "a signature's keyid is not a string");
    std::string sig = b64(member(s, "sig"), "a signature's sig", where);
    if (!b.has_sig) b.sig = sig, b.has_sig = true;   // the library checks the first
  }
}

Bundle read_bundle(const std::string& data, const std::string& where) {
  json::Value doc;
  try {
    doc = json::parse(data, kOmsSignature, rules::kMaxBundle);
  } catch (const ArtifactError& e) {
    malformed(where, "JSONDecodeError: " + cut(e.found(), 120));
  }
  object(&doc, "the bundle", {"mediaType", "verificationMaterial", "messageSignature", "dsseEnvelope"}, where);
  Bundle b;
  const json::Value* media = member(doc, "mediaType");
  if (!media || media->type != Type::String ||
      std::none_of(std::begin(kMediaTypes), std::end(kMediaTypes), [&](const char* t) { return media->s == t; }))
    malformed(where, "mediaType is not a Sigstore bundle's");
  b.media_type = media->s;
  read_material(doc, b, where);
  read_envelope(doc, b, where);
  if (b.tlog) raise<ArtifactError>(rules::kOmsKeyless, {{"where", where}});
  return b;
}

// ------------------------------------------------------------------------- one key's check
using Key = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

// Whether `sig` (DER) is `key`'s ECDSA signature of `message`, hashed as model_signing's
// get_ec_key_hash says (SHA-256, -384, -512 by the curve's size).
bool ecdsa_verify(EVP_PKEY* key, const std::string& sig, const std::string& message) {
  if (!key || EVP_PKEY_get_base_id(key) != EVP_PKEY_EC) return false;
  int bits = EVP_PKEY_get_bits(key);
  const EVP_MD* md = bits == 256 ? EVP_sha256() : bits == 384 ? EVP_sha384() : EVP_sha512();
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  return ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, md, nullptr, key) == 1 &&
         EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                          reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
}

Key pem_key(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> in(BIO_new_mem_buf(pem.data(), int(pem.size())), BIO_free);
  return Key(in ? PEM_read_bio_PUBKEY(in.get(), nullptr, nullptr, nullptr) : nullptr, EVP_PKEY_free);
}

// DSSE v1's pre-authentication encoding of an in-toto payload.
std::string pae(const std::string& payload) {
  return "DSSEv1 " + std::to_string(std::string(kPayloadType).size()) + " " + kPayloadType + " " +
         std::to_string(payload.size()) + " " + payload;
}

bool hex_digest(const std::string& s) {
  return s.size() % 2 == 0 && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(uint8_t(c)); });
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(uint8_t(c)));
  return s;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

// The statement's form (model_signing dsse_payload_to_manifest): its subject's root digest is
// sha256 over the resources' digests in order.
void check_form(const json::Value& st) {
  if (str(member(st, "_type"), "_type") != kStatementType)
    throw Failure{"Expected in-toto " + std::string(kStatementType) + " payload, but got " + member(st, "_type")->s};
  if (str(member(st, "predicateType"), "predicateType") != kPredicateType)
    throw Failure{"Predicate type mismatch, expected " + std::string(kPredicateType) + ", got " +
                  member(st, "predicateType")->s};
  const json::Value* subjects = member(st, "subject");
  if (!subjects || subjects->type != Type::Array || subjects->items.size() != 1)
    throw Failure{"Expected only one subject"};
  const json::Value& subject = subjects->items[0];
  str(member(subject, "name"), "subject name");
  const json::Value* digest = member(subject, "digest");
  if (!digest) throw Failure{"no subject digest"};
  const std::string& root = str(member(*digest, "sha256"), "subject digest");
  const json::Value* pred = member(st, "predicate");
  const json::Value* ser = pred ? member(*pred, "serialization") : nullptr;
  const json::Value* method = ser ? member(*ser, "method") : nullptr;
  if (!method || method->type != Type::String || (method->s != "files" && method->s != "shards"))
    throw Failure{"Unknown serialization type"};
  if (!member(*ser, "hash_type") || !member(*ser, "allow_symlinks") ||
      (method->s == "shards" && !member(*ser, "shard_size")))
    throw Failure{"serialization arguments missing"};
  const json::Value* res = member(*pred, "resources");
  if (!res || res->type != Type::Array) throw Failure{"no resources"};
  std::string digests;
  for (const json::Value& r : res->items) {
    str(member(r, "name"), "resource name");
    str(member(r, "algorithm"), "resource algorithm");
    const std::string& d = str(member(r, "digest"), "resource digest");
    if (!hex_digest(d)) throw Failure{"non-hexadecimal digest"};
    digests += unhex(d);
  }
  if (sha256_hex(digests.data(), digests.size()) != root)
    throw Failure{"Manifest is inconsistent. Root digest is " + root + ", but the included resources hash "
                  "to " + sha256_hex(digests.data(), digests.size())};
}

json::Value payload_statement(const Bundle& b);

// The statement `b` carries, if `anchor` verifies it (model_signing's key-method Verifier).
json::Value statement(const Bundle& b, const Anchor& anchor) {
  if (b.media_type != kMediaType)
    throw Failure{"Invalid sigstore bundle, got media type " + b.media_type + " but expected " + kMediaType};
  if (!b.has_key) throw Failure{"the bundle names no public key"};
  if (!b.hint.empty() && b.hint != sha256_hex(anchor.raw.data(), anchor.raw.size()))
    throw Failure{"Key mismatch: The public key hash in the signature's verification material does not "
                  "match the provided public key. "};
  if (!b.has_envelope) throw Failure{"the bundle holds no DSSE envelope"};
  if (!b.has_sig) throw Failure{"the DSSE envelope holds no signature"};
  if (!ecdsa_verify(pem_key(anchor.raw).get(), b.sig, pae(b.payload))) throw Failure{"InvalidSignature"};
  return payload_statement(b);
}

// The statement of an envelope whose signature verified (model_signing Verifier.verify).
json::Value payload_statement(const Bundle& b) {
  if (b.payload_type != kPayloadType)
    throw Failure{"Expected DSSE payload " + std::string(kPayloadType) + ", but got " + b.payload_type};
  json::Value st;
  try {
    st = json::parse(b.payload, "the statement", rules::kMaxBundle);
  } catch (const ArtifactError& e) {
    throw Failure{"JSONDecodeError: " + e.found()};
  }
  check_form(st);
  return st;
}

using Cert = std::unique_ptr<X509, decltype(&X509_free)>;

Cert der_cert(const std::string& der) {
  const unsigned char* at = reinterpret_cast<const unsigned char*>(der.data());
  return Cert(d2i_X509(nullptr, &at, long(der.size())), X509_free);
}

// The signing certificate of `b`, verified up to the trusted certificate `root` as of its own
// start of validity, allowed to sign (key usage digitalSignature, or extended key usage code
// signing), as model_signing's certificate Verifier checks it.
Cert signing_certificate(const Bundle& b, const Anchor& root) {
  Cert leaf = der_cert(b.chain[0]), trusted = der_cert(root.raw);
  if (!leaf || !trusted) throw Failure{"the signing certificate is not DER X.509"};
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), X509_STORE_free);
  std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)> chain(
      sk_X509_new_null(), [](STACK_OF(X509)* s) { sk_X509_pop_free(s, X509_free); });
  for (size_t i = 1; i < b.chain.size(); ++i) {
    Cert c = der_cert(b.chain[i]);
    if (!c) throw Failure{"a chain certificate is not DER X.509"};
    sk_X509_push(chain.get(), c.release());
  }
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(), X509_STORE_CTX_free);
  struct tm start {};
  if (!store || !chain || !ctx || X509_STORE_add_cert(store.get(), trusted.get()) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), leaf.get(), chain.get()) != 1 ||
      ASN1_TIME_to_tm(X509_get0_notBefore(leaf.get()), &start) != 1)
    throw Failure{"cannot set up the certificate check"};
  X509_STORE_CTX_set_time(ctx.get(), 0, timegm(&start));
  if (X509_verify_cert(ctx.get()) != 1)
    throw Failure{X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()))};
  uint32_t usage = X509_get_key_usage(leaf.get()), extended = X509_get_extended_key_usage(leaf.get());
  if (!(usage != UINT32_MAX && (usage & KU_DIGITAL_SIGNATURE)) &&
      !(extended != UINT32_MAX && (extended & XKU_CODE_SIGN)))
    throw Failure{"Signing certificate cannot be used for signing"};
  return leaf;
}

// The statement `b` carries, if its chain leads to `root` and its signing certificate's key
// verifies it (model_signing's certificate Verifier); `signer`: that certificate's subject.
json::Value certificate_statement(const Bundle& b, const Anchor& root, std::string& signer) {
  if (b.media_type != kMediaType)
    throw Failure{"Invalid sigstore bundle, got media type " + b.media_type + " but expected " + kMediaType};
  Cert leaf = signing_certificate(b, root);
  if (!b.has_envelope) throw Failure{"the bundle holds no DSSE envelope"};
  if (!b.has_sig) throw Failure{"the DSSE envelope holds no signature"};
  if (!ecdsa_verify(X509_get0_pubkey(leaf.get()), b.sig, pae(b.payload))) throw Failure{"InvalidSignature"};
  signer = subject_of(leaf.get(), false);
  return payload_statement(b);
}

// ---------------------------------------------------------------------------- the statement
// Python's repr of a serialization argument, as artifact/oms.py quotes it.
std::string repr(const json::Value* v) {
  return !v ? "None" : v->type == Type::String ? "'" + v->s + "'" : json::dump(*v);
}

std::string shown(const std::vector<std::string>& names) {   // oms.py statement_diff
  std::string out;
  for (size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
  return names.size() > 5 ? out + " and " + std::to_string(names.size() - 5) + " more" : out;
}

std::vector<std::string> differences(const std::map<std::string, std::string>& signed_,
                                     const std::map<std::string, std::string>& actual) {
  std::vector<std::string> changed, extra, missing, out;
  for (const auto& [name, d] : actual) {
    auto it = signed_.find(name);
    if (it == signed_.end()) extra.push_back(name);
    else if (it->second != d) changed.push_back(name);
  }
  for (const auto& [name, d] : signed_)
    if (!actual.count(name)) missing.push_back(name);
  if (!changed.empty()) out.push_back("hash differs from the signed one: " + shown(changed));
  if (!extra.empty()) out.push_back("not covered by the signature (extra): " + shown(extra));
  if (!missing.empty()) out.push_back("signed but missing from the artifact: " + shown(missing));
  return out;
}

void check_statement(const Artifact& art, const json::Value& st, const std::string& where) {
  const json::Value& pred = *member(st, "predicate");
  const json::Value* ser = member(pred, "serialization");
  const json::Value *method = member(*ser, "method"), *hash = member(*ser, "hash_type");
  if (!method || method->type != Type::String || method->s != "files" || !hash ||
      hash->type != Type::String || hash->s != "sha256")
    raise<ArtifactError>(rules::kOmsHashing, {{"where", where},
                                              {"found", "method " + repr(method) + ", hash_type " + repr(hash)}});
  const auto& resources = member(pred, "resources")->items;
  if (resources.size() > rules::kMaxOmsResources)
    raise<ArtifactError>(rules::kOmsTooMany,
                         {{"where", where}, {"found", std::to_string(resources.size()) + " resources"}});
  std::map<std::string, std::string> signed_, actual;
  for (const json::Value& r : resources) {
    if (member(r, "algorithm")->s != "sha256") raise<ArtifactError>(rules::kOmsNotSha256, {{"where", where}});
    signed_[member(r, "name")->s] = lower(member(r, "digest")->s);
  }
  actual["manifest.json"] = sha256_hex(art.manifest_bytes().data(), art.manifest_bytes().size());
  for (const auto& [rel, e] : art.files()) actual[rel] = e.sha256.empty() ? art.whole_sha256(rel) : e.sha256;
  std::vector<std::string> diff = differences(signed_, actual);
  std::vector<std::string> ignored = kGitPaths;
  ignored.insert(ignored.end(), {kOmsSignature, "signatures.json"});
  std::vector<std::string> extra = art.unlisted(kGitPaths, ignored, 1000);
  if (!extra.empty()) {
    extra.resize(std::min<size_t>(extra.size(), 5));
    std::string names;
    for (const auto& n : extra) names += (names.empty() ? "" : ", ") + n;
    diff.push_back("not covered by the signature (extra): " + names);
  }
  std::string found;
  for (const auto& d : diff) found += (found.empty() ? "" : "; ") + d;
  if (!diff.empty()) raise<ArtifactError>(rules::kOmsNotExact, {{"where", where}, {"found", cut(found, 600)}});
}

}  // namespace

std::string verify_oms(const Artifact& art, const std::string& data, const std::vector<Anchor>& anchors) {
  std::string where = art.where(kOmsSignature);
  Bundle b = read_bundle(data, where);
  std::string kind = b.chain.empty() ? "ec" : "certificate";   // oms.py _method
  std::vector<std::string> failures, ids;
  if (std::none_of(anchors.begin(), anchors.end(), [&](const Anchor& a) { return a.kind == kind; }))
    failures.push_back("a bundle of the " + std::string(kind == "ec" ? "key" : kind) +
                       " method, and no trusted key of that kind");
  for (const Anchor& a : anchors) ids.push_back("'" + a.key_id + "'");
  for (const Anchor& a : anchors) {
    if (a.kind != kind) continue;
    json::Value st;
    std::string signer;
    try {
      st = kind == "ec" ? statement(b, a) : certificate_statement(b, a, signer);
    } catch (const Failure& f) {
      failures.push_back(a.key_id + ": " + cut(f.why, 100));
      continue;
    }
    check_statement(art, st, where);   // the first anchor that verifies decides
    return kind == "ec" ? "OMS key " + a.key_id : "OMS certificate " + signer;
  }
  std::string found, list;
  for (const auto& f : failures) found += (found.empty() ? "" : "; ") + f;
  for (const auto& id : ids) list += (list.empty() ? "" : ", ") + id;
  raise<ArtifactError>(rules::kOmsUntrusted, {{"where", where}, {"ids", "[" + list + "]"}, {"found", cut(found, 400)}});
}

}  // namespace aotc::fe
