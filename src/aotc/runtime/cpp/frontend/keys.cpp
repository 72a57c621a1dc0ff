// Trusted keys (keys.h): base64, PEM and the Ed25519 SubjectPublicKeyInfo, AOTC_TRUSTED_KEYS.
#include "keys.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "aotc/errors.h"
#include "files.h"
#include "json.h"
#include "templates.h"

namespace aotc::fe {

namespace {

constexpr size_t kMaxKeyFile = 1 << 20;   // far above any public key's PEM
// RFC 8410: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING (0 unused bits) of 32 bytes }
constexpr unsigned char kSpkiPrefix[12] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03,
                                           0x2b, 0x65, 0x70, 0x03, 0x21, 0x00};
const char* kWhere = "trusted_keys";
const char* kKeygenFix = "use the .pub file `aotc keygen` wrote";

int b64value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  return c == '+' ? 62 : c == '/' ? 63 : -1;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view strip(std::string_view s, bool right = true) {   // bytes.strip() / lstrip()
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (right && !s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// What is no public key is never echoed: it may be a secret (a private key, a password).
[[noreturn]] void not_a_key(std::string_view key) {
  if (key.find("PRIVATE KEY-----") != std::string_view::npos) raise<UsageError>(rules::kPrivateKey);
  throw UsageError("a trusted key is not an Ed25519 public key", kWhere,
                   "a PEM public key, its file, or 32 raw bytes (base64)",
                   std::to_string(key.size()) + " bytes (not shown)", kKeygenFix);
}

[[noreturn]] void not_ed25519(const std::string& found) {
  throw UsageError("the trusted key is not an Ed25519 key", kWhere, "an Ed25519 public key", found,
                   "use a key written by `aotc keygen`");
}

// One DER element of `tag` at d[pos] (definite, minimal lengths): its contents, or false.
bool der(std::string_view d, size_t& pos, unsigned char tag, std::string_view& contents) {
  if (pos + 2 > d.size() || static_cast<unsigned char>(d[pos]) != tag) return false;
  size_t n = static_cast<unsigned char>(d[pos + 1]), at = pos + 2;
  if (n >= 0x80) {
    size_t k = n & 0x7f;
    if (k == 0 || k > 3 || at + k > d.size()) return false;
    n = 0;
    for (size_t i = 0; i < k; ++i) n = n << 8 | static_cast<unsigned char>(d[at + i]);
    if (n < 0x80 || static_cast<unsigned char>(d[at]) == 0) return false;   // not minimal
    at += k;
  }
  if (n > d.size() - at) return false;
  contents = d.substr(at, n);
  pos = at + n;
  return true;
}

// The class name cryptography gives a public key of the algorithm whose OID (DER contents)
// an SPKI names; "" for an SPKI that does not parse.
std::string spki_kind(std::string_view spki) {
  std::string_view body, alg, oid;
  size_t pos = 0, in = 0, a = 0;
  if (!der(spki, pos, 0x30, body) || pos != spki.size() || !der(body, in, 0x30, alg) ||
      !der(alg, a, 0x06, oid))
    return "";
  static const std::pair<std::string_view, const char*> kKinds[] = {
      {"\x2a\x86\x48\x86\xf7\x0d\x01\x01\x01", "RSAPublicKey"},
      {"\x2a\x86\x48\x86\xf7\x0d\x01\x01\x0a", "RSAPublicKey"},
      {"\x2a\x86\x48\xce\x3d\x02\x01", "ECPublicKey"},
      {"\x2a\x86\x48\xce\x38\x04\x01", "DSAPublicKey"},
      {"\x2a\x86\x48\xce\x3e\x02\x01", "DHPublicKey"},
      {"\x2b\x65\x6e", "X25519PublicKey"}, {"\x2b\x65\x6f", "X448PublicKey"},
      {"\x2b\x65\x71", "Ed448PublicKey"}};
  for (const auto& [bytes, name] : kKinds)
    if (oid == bytes) return name;
  return oid == std::string_view("\x2b\x65\x70", 3) ? "" : "a key of an algorithm cryptography does not support";
}

// The text's first PEM block, as cryptography's load_pem_public_key reads it: its label (a
// public key's: PUBLIC KEY or RSA PUBLIC KEY) and its decoded body; false where it is none.
bool pem_block(std::string_view text, std::string& label, std::string& body) {
  const std::string_view begin = "-----BEGIN ", dashes = "-----";
  size_t at = text.find(begin);
  size_t lend = at == std::string_view::npos ? at : text.find(dashes, at + begin.size());
  if (lend == std::string_view::npos) return false;
  label = std::string(text.substr(at + begin.size(), lend - at - begin.size()));
  size_t data = lend + dashes.size(), stop = text.find("-----END " + label + "-----", data);
  if (stop == std::string_view::npos || (label != "PUBLIC KEY" && label != "RSA PUBLIC KEY"))
    return false;
  std::string b64;
  for (char c : text.substr(data, stop - data))
    if (!is_space(c)) b64 += c;
  if (!b64decode_strict(b64, body)) return false;
  // unlike Python's b64decode, the base64 cryptography's PEM reader uses refuses set bits
  // past the last byte
  size_t pad = b64.size() - b64.find_last_not_of('=') - 1;
  int last = pad && pad < b64.size() ? b64value(b64[b64.size() - pad - 1]) : 0;
  return !(pad == 1 && (last & 0x3)) && !(pad == 2 && (last & 0xf));
}

std::string pem_public_key(std::string_view key) {
  std::string label, der_bytes;
  if (!pem_block(key, label, der_bytes)) not_a_key(key);
  if (label == "RSA PUBLIC KEY") not_ed25519("RSAPublicKey");
  if (der_bytes.size() == sizeof kSpkiPrefix + 32 &&
      std::memcmp(der_bytes.data(), kSpkiPrefix, sizeof kSpkiPrefix) == 0)
    return der_bytes.substr(sizeof kSpkiPrefix);
  std::string kind = spki_kind(der_bytes);
  if (kind.empty()) not_a_key(key);   // no SPKI, or an Ed25519 one of another form
  not_ed25519(kind);
}

bool is_file(const std::string& path) {
  struct stat st;
  return path.find('\0') == std::string::npos && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_key_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  std::string why = fd < 0 || ::fstat(fd, &st) != 0 ? std::strerror(errno)
                    : uint64_t(st.st_size) > kMaxKeyFile ? std::to_string(st.st_size) + " bytes" : "";
  if (!why.empty()) {
    if (fd >= 0) ::close(fd);
    throw UsageError("cannot read the trusted key file " + path, path, "a public key file (at most 1 MiB)",
                     why, kKeygenFix);
  }
  std::string out(size_t(st.st_size), '\0');
  size_t got = 0;
  for (ssize_t n; got < out.size() && (n = ::read(fd, out.data() + got, out.size() - got)) > 0;) got += size_t(n);
  ::close(fd);
  out.resize(got);
  return out;
}

// Path.suffix: the name's last ".xxx", where the dot is neither first nor last.
std::string suffix(const std::string& name) {
  size_t dot = name.rfind('.');
  return dot != std::string::npos && dot > 0 && dot + 1 < name.size() ? name.substr(dot) : "";
}

std::vector<std::string> key_files_in(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  std::string why = d ? "" : std::strerror(errno);
  if (!d)
    throw UsageError(std::string(kTrustedKeysEnv) + " names " + json::dump(dir) + ", which cannot be listed",
                     kTrustedKeysEnv, "a readable directory of key files", why,
                     std::string("fix ") + kTrustedKeysEnv + " (entries separated by ':')");
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d.get())) {
    std::string name = e->d_name, sfx = suffix(name);
    if (name != "." && name != ".." && (sfx == ".pub" || sfx == ".pem")) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  std::string base = dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  for (auto& n : names) n = (base == "/" ? base : base + "/") + n;
  return names;
}

}  // namespace

bool b64decode_strict(std::string_view s, std::string& out) {
  out.clear();
  if (!s.empty() && s[0] == '=') return false;   // leading padding
  uint32_t acc = 0;
  int quad = 0, pads = 0;
  bool padding = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '=') {
      padding = true;   // after a whole group (or a lone character) it is skipped
      if (quad >= 2 && quad + ++pads >= 4) return i + 1 == s.size();   // nothing after it
      continue;
    }
    int v = b64value(s[i]);
    if (v < 0 || padding) return false;   // not base64, or data after padding began
    acc = acc << 6 | uint32_t(v);
    if (quad) out += char((acc >> (6 - 2 * quad)) & 0xff);
    quad = (quad + 1) & 3;
  }
  return quad == 0;   // 1: a lone character; 2, 3: the padding is missing
}

std::string public_key_bytes(const std::string& key, bool is_path) {
  std::string bytes = key;
  if (is_path) {
    if (!is_file(key)) not_a_key(key);   // e.g. a directory called x.pub
    bytes = read_key_file(key);
  } else if (key.rfind("-----", 0) != 0 && is_file(key)) {
    bytes = read_key_file(key);
  }
  if (bytes.size() == 32) return bytes;
  if (strip(bytes, false).substr(0, 10) == "-----BEGIN") return pem_public_key(bytes);
  std::string raw;
  if (!b64decode_strict(strip(bytes), raw) || raw.size() != 32) not_a_key(bytes);
  return raw;
}

std::optional<std::vector<std::string>> trusted_from_env() {
  const char* env = std::getenv(kTrustedKeysEnv);
  if (!env || !*env) return std::nullopt;
  std::vector<std::string> keys;
  std::string value = env;
  for (size_t at = 0; at <= value.size();) {
    size_t colon = std::min(value.find(':', at), value.size());
    std::string part = value.substr(at, colon - at);
    at = colon + 1;
    if (part.empty()) continue;
    struct stat st;
    bool exists = ::stat(part.c_str(), &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) {
      for (auto& k : key_files_in(part)) keys.push_back(std::move(k));
    } else if (exists && S_ISREG(st.st_mode)) {
      keys.push_back(part);
    } else {
      throw UsageError(std::string(kTrustedKeysEnv) + " names " + json::dump(part) +
                       ", which is no key file or directory", kTrustedKeysEnv,
                       "key files or directories", part,
                       std::string("fix ") + kTrustedKeysEnv + " (entries separated by ':')");
    }
  }
  return keys;
}

std::string key_id(std::string_view raw) { return sha256_hex(raw.data(), raw.size()).substr(0, 16); }

}  // namespace aotc::fe
