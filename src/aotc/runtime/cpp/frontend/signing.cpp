// Signed artifacts (signing.h): signatures.json read as runtime/signing.py read_signatures reads
// it through runtime/schema/fields.py, whose error messages are reproduced here field for field.
#include "signing.h"

#include <algorithm>
#include <initializer_list>
#include <set>

#include "ed25519.h"
#include "files.h"
#include "json.h"
#include "keys.h"
#include "pyrepr.h"

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

std::string short_str(const std::string& s) {
  json::Value v;
  v.type = Type::String;
  v.s = s;
  return py::short_repr(v);
}

const json::Value* member(const json::Value& v, const std::string& key) {
  for (const auto& [k, m] : v.members)
    if (k == key) return &m;
  return nullptr;
}

// At.obj(required=...): an object with every required field and no other.
void object(const json::Value& v, const std::string& path, std::initializer_list<const char*> required) {
  if (v.type != Type::Object) fail(path, "a JSON object", py::short_repr(v), "is not an object");
  for (const char* k : required)
    if (!member(v, k)) fail(child(path, k), std::string("a field ") + py::repr(k), "nothing", "is missing");
  std::vector<std::string> allowed(required.begin(), required.end()), extra;
  for (const auto& [k, m] : v.members)
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) extra.push_back(k);
  if (extra.empty()) return;
  std::sort(extra.begin(), extra.end());
  std::sort(allowed.begin(), allowed.end());
  fail(child(path, extra[0]), "only the fields " + py::list_repr(allowed), short_str(extra[0]),
       "is not a field of this format");
}

// At.str(max_len=..., choices=...).
const std::string& text(const json::Value& v, const std::string& path, size_t max_len,
                        const char* choice = nullptr) {
  if (v.type != Type::String) fail(path, "a string", py::short_repr(v), "is not a string");
  size_t n = py::length(v.s);
  if (n > max_len)
    fail(path, "a string of at most " + std::to_string(max_len) + " characters",
         std::to_string(n) + " characters");
  if (choice && v.s != choice)
    fail(path, "one of " + py::list_repr({choice}), py::short_repr(v), "is not a known value");
  return v.s;
}

// Python decodes the bytes before parsing (json.loads of bytes: UTF-8, a leading byte-order
// mark dropped, encoded surrogates let through); the C++ reader takes the text as it is.
std::string_view utf8_text(const std::string& data) {
  std::string_view t = data;
  if (t.substr(0, 3) == "\xEF\xBB\xBF") t.remove_prefix(3);
  for (size_t i = 0; i < t.size();) {
    auto b = static_cast<unsigned char>(t[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    bool ok = n && i + n <= t.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(t[i + k]) & 0xC0) == 0x80;
    uint32_t c = ok && n > 1 ? b & (0x7F >> n) : b;
    for (size_t k = 1; ok && k < n; ++k) c = c << 6 | (static_cast<unsigned char>(t[i + k]) & 0x3F);
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};   // shortest forms only
    if (!ok || c < kMin[n] || c > 0x10FFFF)
      throw ArtifactError(std::string(kFile) + " is not valid JSON (not UTF-8 text)",
                          std::string(kFile) + ", byte " + std::to_string(i), "UTF-8 text",
                          "a byte sequence that is no UTF-8", kFix);
    i += n;
  }
  return t;
}

}  // namespace

std::vector<Signature> read_signatures(const Artifact& art) {
  std::optional<std::string> data = art.read_unlisted(kFile, kMaxSignaturesFile);
  if (!data) return {};
  json::Value doc = json::parse(utf8_text(*data), kFile, kMaxSignaturesFile);
  object(doc, "", {"format", "signatures"});
  const json::Value& format = *member(doc, "format");
  if (format.type != Type::Int) fail("format", "an integer in [1, 1]", py::short_repr(format), "is not an integer");
  if (format.i != 1) fail("format", "an integer in [1, 1]", py::short_repr(format), "is out of range");
  const json::Value& list = *member(doc, "signatures");
  if (list.type != Type::Array) fail("signatures", "a JSON list", py::short_repr(list), "is not a list");
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

std::string check_signature(const Artifact& art, const std::vector<std::string>& trusted_keys) {
  std::vector<std::string> env = trusted_from_env();
  if (trusted_keys.empty() && env.empty()) return "";
  std::set<std::string> trusted;
  for (const auto& k : trusted_keys) trusted.insert(key_id(public_key_bytes(k)));
  for (const auto& path : env) trusted.insert(key_id(public_key_bytes(path, true)));
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
                      : "signatures by " + py::list_repr(ids) + (all_verify ? "" : " (some do not verify)");
  throw ArtifactError("the artifact is not signed by a trusted key", art.where(kFile),
                      "a valid signature by one of " +
                          py::list_repr(std::vector<std::string>(trusted.begin(), trusted.end())),
                      found, "sign it with a trusted key (`aotc sign ART --key KEY`), or load it "
                             "from the producer you trust");
}

}  // namespace aotc::fe
