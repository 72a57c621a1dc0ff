// Signed artifacts (signing.h): signatures.json read as artifact/signing.py read_signatures reads
// it through artifact/schema/fields.py, with the same field errors (values quoted as both quote
// them: json::dump); signatures verified by OpenSSL's libcrypto.
#include "signing.h"

#include <openssl/evp.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <set>

#include "files.h"
#include "json.h"
#include "keys.h"
#include "oms.h"
#include "templates.h"

namespace aotc::fe {

namespace {

using Type = json::Value::Type;
const char* kFile = "signatures.json";
const char* kFix = "re-export the model with this aotc; the artifact is damaged or was not "
                   "written by aotc";   // fields.py FIX

// fields.py At.fail: "<file>: <field> <problem>", the field named by its path.
[[noreturn]] void fail(const std::string& path, const std::string& expected,
                       const std::string& found, const std::string& problem = "is malformed") {
  std::string field = path.empty() ? "the document" : path;
  throw ArtifactError(std::string(kFile) + ": " + field + " " + problem,
                      std::string(kFile) + ", field " + field, expected, found, kFix);
}

std::string child(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

const json::Value* member(const json::Value& v, const std::string& key) {
  for (const auto& [k, m] : v.members)
    if (k == key) return &m;
  return nullptr;
}

// At.obj(required=...): an object with every required field and no other.
void object(const json::Value& v, const std::string& path, std::initializer_list<const char*> required) {
  if (v.type != Type::Object) fail(path, "a JSON object", json::dump(v), "is not an object");
  for (const char* k : required)
    if (!member(v, k)) fail(child(path, k), "a field " + json::dump(std::string(k)), "nothing", "is missing");
  std::vector<std::string> allowed(required.begin(), required.end()), extra;
  for (const auto& [k, m] : v.members)
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) extra.push_back(k);
  if (extra.empty()) return;
  std::sort(extra.begin(), extra.end());
  std::sort(allowed.begin(), allowed.end());
  fail(child(path, extra[0]), "only the fields " + json::dump(allowed), json::dump(extra[0]),
       "is not a field of this format");
}

// At.str(max_len=..., choices=...).
const std::string& text(const json::Value& v, const std::string& path, size_t max_len,
                        const char* choice = nullptr) {
  if (v.type != Type::String) fail(path, "a string", json::dump(v), "is not a string");
  size_t n = json::length(v.s);
  if (n > max_len)
    fail(path, "a string of at most " + std::to_string(max_len) + " characters",
         std::to_string(n) + " characters");
  if (choice && v.s != choice)
    fail(path, "one of " + json::dump(std::vector<std::string>{choice}), json::dump(v), "is not a known value");
  return v.s;
}

// artifact/signing.py's list of key ids in a message ("['a', 'b']"): key ids are hex digits
// where aotc wrote them; a claimed one is quoted as written.
std::string id_list(const std::vector<std::string>& ids) {
  std::string out = "[";
  for (const auto& id : ids) out += (out.size() > 1 ? ", '" : "'") + id + "'";
  return out + "]";
}

}  // namespace

bool ed25519_verify(std::string_view public_key, std::string_view signature,
                    std::string_view message) {
  if (public_key.size() != kEd25519KeyBytes || signature.size() != kEd25519SignatureBytes) return false;
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                  reinterpret_cast<const unsigned char*>(public_key.data()),
                                  public_key.size()), EVP_PKEY_free);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  return key && ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
         EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

std::vector<Signature> read_signatures(const Artifact& art) {
  std::optional<std::string> data = art.read_unlisted(kFile, kMaxSignaturesFile);
  if (!data) return {};
  json::Value doc = json::parse(*data, kFile, kMaxSignaturesFile);
  object(doc, "", {"format", "signatures"});
  const json::Value& format = *member(doc, "format");
  if (format.type != Type::Int) fail("format", "an integer in [1, 1]", json::dump(format), "is not an integer");
  if (format.i != 1) fail("format", "an integer in [1, 1]", json::dump(format), "is out of range");
  const json::Value& list = *member(doc, "signatures");
  if (list.type != Type::Array) fail("signatures", "a JSON list", json::dump(list), "is not a list");
  if (list.items.size() > kMaxSignatures)
    fail("signatures", "a list of 0.." + std::to_string(kMaxSignatures) + " items",
         std::to_string(list.items.size()) + " items");
  std::vector<Signature> out;
  for (size_t i = 0; i < list.items.size(); ++i) {
    const json::Value& s = list.items[i];
    std::string path = "signatures[" + std::to_string(i) + "]";
    object(s, path, {"algorithm", "key_id", "public_key", "signature"});
    text(*member(s, "algorithm"), path + ".algorithm", 4096, "ed25519");   // fields.py MAX_STR
    Signature sig;
    sig.key_id = text(*member(s, "key_id"), path + ".key_id", 128);
    sig.public_key = text(*member(s, "public_key"), path + ".public_key", 128);
    sig.signature = text(*member(s, "signature"), path + ".signature", 128);
    out.push_back(std::move(sig));
  }
  return out;
}

std::map<std::string, bool> verified_signers(std::string_view manifest,
                                             const std::vector<Signature>& signatures) {
  std::map<std::string, bool> out;
  for (const Signature& s : signatures) {
    std::string raw, sig;
    bool ok = b64decode_strict(s.public_key, raw) && b64decode_strict(s.signature, sig) &&
              raw.size() == kEd25519KeyBytes && ed25519_verify(raw, sig, manifest);
    if (ok) out[key_id(raw)] = key_id(raw) == s.key_id;
    else out[s.key_id] = false;
  }
  return out;
}

namespace {

const char* kSignFix = "sign it with a trusted key (`aotc sign ART --key KEY`), or load it from the "
                       "producer you trust";

// A trusted Ed25519 key id that signed signatures.json, or the ArtifactError saying why none
// did (artifact/signing.py _ed25519_signer).
std::string ed25519_signer(const Artifact& art, const std::set<std::string>& trusted) {
  std::vector<Signature> signatures = read_signatures(art);
  std::set<std::string> valid, claimed;
  for (const auto& [id, ok] : verified_signers(art.manifest_bytes(), signatures))
    if (ok) valid.insert(id);
  for (const auto& id : valid)   // in sorted order: Python's sorted(valid & trusted)[0]
    if (trusted.count(id)) return id;
  std::vector<std::string> ids;
  for (const auto& s : signatures) ids.push_back(s.key_id), claimed.insert(s.key_id);
  std::sort(ids.begin(), ids.end());
  bool all_verify = std::includes(valid.begin(), valid.end(), claimed.begin(), claimed.end());
  std::string found = signatures.empty() ? "no signature"
                      : "signatures by " + id_list(ids) + (all_verify ? "" : " (some do not verify)");
  throw ArtifactError("the artifact is not signed by a trusted key", art.where(kFile),
                      "a valid signature by one of " +
                          id_list(std::vector<std::string>(trusted.begin(), trusted.end())),
                      found, kSignFix);
}

// Neither signature file could be checked by a trusted key of its kind (signing.py's last
// refusal).
[[noreturn]] void unsigned_for(const Artifact& art, const std::vector<Anchor>& anchors) {
  std::vector<std::string> present, named;
  for (const char* name : {kOmsSignature, kFile})
    if (art.read_unlisted(name, kMaxSignaturesFile)) present.push_back(name);
  for (const Anchor& a : anchors) named.push_back(a.kind + " " + a.key_id);
  std::string files = present.empty() ? "" : present[0] + (present.size() > 1 ? " and " + present[1] : "");
  throw ArtifactError("the artifact is not signed by a trusted key",
                      art.where(present.empty() ? "manifest.json" : present[0]),
                      "a signature by one of " + id_list(named),
                      present.empty() ? "no signature"
                                      : "only " + files + ", which no trusted key of its kind can check",
                      kSignFix);
}

}  // namespace

std::string check_signature(const Artifact& art,
                            const std::optional<std::vector<std::string>>& trusted_keys) {
  std::optional<std::vector<std::string>> env = trusted_from_env();
  if (!trusted_keys && !env) return "";
  std::vector<Anchor> anchors, oms_anchors;
  for (const auto& k : trusted_keys.value_or(std::vector<std::string>{}))
    for (auto& a : anchors_of(k)) anchors.push_back(std::move(a));
  for (const auto& path : env.value_or(std::vector<std::string>{}))
    for (auto& a : anchors_of(path, true)) anchors.push_back(std::move(a));
  if (anchors.empty()) raise<ArtifactError>(rules::kNoUsableKey);   // names keys, yields none: closed
  std::set<std::string> ed25519;
  for (const Anchor& a : anchors)
    if (a.kind == "ed25519") ed25519.insert(a.key_id);
    else oms_anchors.push_back(a);   // EC keys and certificates: OMS bundles
  std::optional<ArtifactError> refusal;   // the first, as artifact/signing.py raises it
  if (!oms_anchors.empty())
    if (std::optional<std::string> bundle = art.read_unlisted(kOmsSignature, rules::kMaxBundle)) try {
        return verify_oms(art, *bundle, oms_anchors);
      } catch (const ArtifactError& e) {
        refusal = e;
      }
  if (!ed25519.empty()) try {
      return ed25519_signer(art, ed25519);
    } catch (const ArtifactError& e) {
      if (!refusal) refusal = e;
    }
  if (refusal) throw *refusal;
  unsigned_for(art, anchors);
}

}  // namespace aotc::fe
