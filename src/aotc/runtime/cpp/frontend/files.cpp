// The artifact reader (files.h).
#include "files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "package.h"

namespace aotc::fe {

namespace {

constexpr size_t kMaxManifest = 64u << 20;
constexpr uint64_t kMaxFile = uint64_t(1) << 48;
const char* kDamaged = "re-export the model; do not edit artifacts by hand";
const char* kRepack = "re-pack the artifact with `aotc pack`, or re-copy the package";

bool name_char(char c, bool first) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '_' || (!first && (c == '.' || c == '-'));
}

std::vector<std::string> components(const std::string& rel) {
  std::vector<std::string> out(1);
  for (char c : rel)
    if (c == '/') out.emplace_back();
    else out.back().push_back(c);
  return out;
}

bool hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The bytes the exporter hashed: the canonical manifest without its top-level self-hash line
// (indent 1: a top-level key is the only one preceded by a newline and exactly one space).
std::string self_hashed(const std::string& raw, std::string& recorded, const std::string& where) {
  const std::string key = "\n \"manifest_sha256\": \"";
  size_t at = raw.find(key);
  size_t end = at == std::string::npos ? at : raw.find("\",", at + key.size());
  if (at == std::string::npos || raw.find(key, at + 1) != std::string::npos ||
      end != at + key.size() + 64)
    throw ArtifactError("manifest.json is damaged: no manifest_sha256", where,
                        "an object with manifest_sha256", "none", kDamaged);
  recorded = raw.substr(at + key.size(), 64);
  return raw.substr(0, at) + raw.substr(end + 2);
}

}  // namespace

std::string sha256_hex(const void* data, size_t n) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, n, digest, &len, EVP_sha256(), nullptr) != 1 || len != 32)
    throw std::runtime_error("OpenSSL's SHA-256 failed");   // only where libcrypto is broken
  static const char kHex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < 32; ++i) out[2 * i] = kHex[digest[i] >> 4], out[2 * i + 1] = kHex[digest[i] & 15];
  return out;
}

bool safe_path(const std::string& rel) {
  auto parts = components(rel);
  if (parts.size() > 4) return false;
  for (const auto& p : parts) {
    if (p.empty() || p.size() > 128 || p == ".." || !name_char(p[0], true)) return false;
    for (char c : p)
      if (!name_char(c, false)) return false;
  }
  return true;
}

std::string read_at(int fd, uint64_t offset, size_t size, const std::string& where, const char* fix) {
  std::string out(size, '\0');
  for (size_t got = 0; got < size;) {
    ssize_t n = ::pread(fd, out.data() + got, std::min<size_t>(size - got, 1 << 24), off_t(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw ArtifactError(n < 0 ? "cannot read " + where : where + " ended while being read", where,
                          std::to_string(size) + " bytes",
                          n < 0 ? std::string(std::strerror(errno)) : std::to_string(got) + " bytes", fix);
    got += size_t(n);
  }
  return out;
}

Bytes::~Bytes() {
  if (map) ::munmap(map, map_size);
}

// A file's descriptor (closed with this when the artifact's own, a directory's file) and the
// place of its bytes in it (a package's member).
struct Artifact::Opened {
  int fd = -1;
  bool owned = false;
  uint64_t base = 0, size = 0;
  Opened(int f, bool own, uint64_t b, uint64_t s) : fd(f), owned(own), base(b), size(s) {}
  Opened(Opened&& o) noexcept : fd(o.fd), owned(o.owned), base(o.base), size(o.size) { o.owned = false; }
  Opened(const Opened&) = delete;
  ~Opened() {
    if (owned) ::close(fd);
  }
};

Artifact::Artifact(const std::string& path, bool verify_hashes) : root_(path), verify_(verify_hashes) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    package_ = std::make_unique<Package>(path);
  } else {
    dirfd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dirfd_ < 0)
      throw ArtifactError("cannot open artifact " + path, path, "an artifact directory (not a symlink) "
                          "or a package file", std::strerror(errno),
                          "check the path (aotc export ... -o " + path + ")");
  }
  try {
    read_manifest();
    parse_files();
    check_members();
  } catch (...) {
    if (dirfd_ >= 0) ::close(dirfd_);
    throw;
  }
}

Artifact::~Artifact() {
  if (dirfd_ >= 0) ::close(dirfd_);
}

std::string Artifact::where(const std::string& rel) const {
  return package_ ? package_->where(rel) : root_ + "/" + rel;
}

// The manifest, its self-hash and format version checked.
void Artifact::read_manifest() {
  Opened f = open_file("manifest.json");
  if (f.size > kMaxManifest)
    throw ArtifactError("manifest.json is too large", where("manifest.json"),
                        "at most 64 MiB", std::to_string(f.size) + " bytes", kDamaged);
  std::string raw = read_at(f.fd, f.base, size_t(f.size), where("manifest.json"), kDamaged);
  std::string recorded, hashed = self_hashed(raw, recorded, where("manifest.json"));
  std::string actual = sha256_hex(hashed.data(), hashed.size());
  if (actual != recorded)
    throw ArtifactError("manifest.json was modified after export (hash mismatch)",
                        where("manifest.json"), recorded, actual, kDamaged);
  manifest_ = json::parse(raw, manifest_name_, kMaxManifest);
  if (field()["manifest_sha256"].string() != recorded)
    throw ArtifactError("manifest.json is damaged: two self-hashes", where("manifest.json"),
                        recorded, field()["manifest_sha256"].string(), kDamaged);
  version_ = int(field()["format_version"].integer(1, 1 << 20));
  if (version_ > kFormatVersion)
    throw ArtifactError("artifact format version " + std::to_string(version_) +
                        " is not supported by this aotc", where("manifest.json"),
                        "format version " + std::to_string(kFormatVersion),
                        std::to_string(version_), "upgrade aotc to load artifacts of a newer format");
  manifest_bytes_ = std::move(raw);
}

void Artifact::parse_files() {
  json::Field files = field()["files"];
  for (const auto& [rel, v] : files.members(1 << 16)) {
    json::Field f = files.member(rel, v);
    if (!safe_path(rel))
      f.fail("a relative path inside the artifact (letters, digits, _ . -; no ..)", rel.substr(0, 200));
    FileEntry e;
    e.size = uint64_t(f["size"].integer(0, int64_t(kMaxFile)));
    if (f.has("sha256")) {
      e.sha256 = f["sha256"].string();
      if (!hex64(e.sha256)) f["sha256"].fail("64 hex digits", f["sha256"].found());
    }
    if (f.has("chunks")) {
      json::Field c = f["chunks"];
      e.chunk = uint64_t(c["size"].integer(1, int64_t(kMaxFile)));
      size_t n = c["sha256"].size(1 << 24);
      if (n != (e.size + e.chunk - 1) / e.chunk) c["sha256"].fail("one digest per chunk", std::to_string(n));
      for (size_t i = 0; i < n; ++i) {
        e.chunks.push_back(c["sha256"][i].string());
        if (!hex64(e.chunks.back())) c["sha256"][i].fail("64 hex digits", c["sha256"][i].found());
      }
    }
    if (e.sha256.empty() && e.chunks.empty()) f.fail("a sha256 or chunk digests", "no digest");
    files_[rel] = std::move(e);
  }
}

// A package holds the manifest, the signature files (signatures.json; model.sig, an OMS
// bundle: oms.h) and the listed files, nothing else (its members in
// index order, as artifact/reader.py checks them).
void Artifact::check_members() const {
  if (package_)
    for (const auto& [name, m] : package_->rows())
      if (!files_.count(name) && name != "manifest.json" && name != "signatures.json" &&
          name != "model.sig")
        throw ArtifactError("package member " + name + " is not listed in its manifest", where(name),
                            "only files the manifest lists", "an unlisted member " + name,
                            "re-pack the artifact with `aotc pack`");
}

// Every listed file exists with its listed size (in name order, as artifact/reader.py checks
// them).
void Artifact::check_listed() const {
  for (const auto& [rel, e] : files_) open_listed(rel, e.size);
}

// File `rel` opened inside the artifact: a package's member, or a directory's regular file
// reached one component at a time without following a symlink.
Artifact::Opened Artifact::open_file(const std::string& rel) const {
  if (package_) {
    const Member* m = package_->member(rel);
    if (!m)
      throw ArtifactError("artifact file " + rel + " is missing from the package", where(rel),
                          "the file the manifest lists", "no such member", kRepack);
    return Opened(package_->fd(), false, m->offset, m->size);
  }
  auto parts = components(rel);
  int dir = dirfd_;
  for (size_t i = 0; i < parts.size(); ++i) {
    bool last = i + 1 == parts.size();
    int fd = ::openat(dir, parts[i].c_str(),
                      O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (last ? O_NONBLOCK : O_DIRECTORY));
    int err = errno;
    if (dir != dirfd_) ::close(dir);
    if (fd < 0)
      throw ArtifactError("artifact file " + rel + " cannot be opened", where(rel),
                          "a regular file inside the artifact (no symlinks)", std::strerror(err),
                          kDamaged);
    dir = fd;
  }
  Opened f(dir, true, 0, 0);
  struct stat st;
  if (::fstat(dir, &st) != 0 || !S_ISREG(st.st_mode))
    throw ArtifactError("artifact file " + rel + " is not a regular file", where(rel),
                        "a regular file", "another kind of file", kDamaged);
  f.size = uint64_t(st.st_size);
  return f;
}

// Listed file `rel`, whose size must be the listed `size`.
Artifact::Opened Artifact::open_listed(const std::string& rel, uint64_t size) const {
  Opened f = open_file(rel);
  if (f.size != size)
    throw ArtifactError("artifact file " + rel + " has the wrong size (truncated or modified)",
                        where(rel), std::to_string(size) + " bytes",
                        std::to_string(f.size) + " bytes", "re-export or re-copy the artifact");
  return f;
}

void Artifact::verify(const std::string& rel, const FileEntry& e, const uint8_t* data) const {
  if (!verify_) return;
  auto mismatch = [&](const std::string& want, const std::string& got, const std::string& what) {
    throw ArtifactError("artifact file " + rel + " is damaged (" + what + " mismatch)", where(rel),
                        want, got, "re-export or re-copy the artifact");
  };
  if (!e.sha256.empty()) {
    std::string got = sha256_hex(data, e.size);
    if (got != e.sha256) mismatch(e.sha256, got, "sha256");
  }
  if (e.chunks.empty()) return;
  std::vector<std::string> got(e.chunks.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < got.size();)
      got[i] = sha256_hex(data + i * e.chunk, std::min<uint64_t>(e.chunk, e.size - i * e.chunk));
  };
  size_t n = std::min<size_t>(got.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != e.chunks[i])
      mismatch(e.chunks[i], got[i], "sha256 of chunk " + std::to_string(i) + " of " +
               std::to_string(got.size()) + ", bytes " + std::to_string(i * e.chunk) + ".." +
               std::to_string(std::min<uint64_t>(e.size, (i + 1) * e.chunk)));
}

std::shared_ptr<const Bytes> Artifact::read(const std::string& rel, bool mapped) const {
  auto it = files_.find(rel);
  if (it == files_.end())
    throw ArtifactError("the artifact does not list " + rel, where("manifest.json"),
                        "a file entry for " + rel, "none", kDamaged);
  const FileEntry& e = it->second;
  Opened f = open_listed(rel, e.size);
  auto out = std::make_shared<Bytes>();
  out->size = e.size;
  if (mapped && e.size) {   // from the page boundary at or before the file's bytes
    uint64_t lead = f.base % uint64_t(::sysconf(_SC_PAGESIZE));
    out->map_size = size_t(e.size + lead);
    out->map = ::mmap(nullptr, out->map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, f.fd, off_t(f.base - lead));
    if (out->map == MAP_FAILED) {
      out->map = nullptr;
      throw ArtifactError("cannot map " + rel, where(rel), "a mappable file", std::strerror(errno),
                          "check the memory limits of this process");
    }
    out->data = static_cast<const uint8_t*>(out->map) + lead;
  } else {
    out->heap = read_at(f.fd, f.base, size_t(e.size), where(rel), kDamaged);
    out->data = reinterpret_cast<const uint8_t*>(out->heap.data());
  }
  verify(rel, e, out->data);
  verified_.insert(rel);
  return out;
}

void Artifact::verify_unread() const {
  for (const auto& [rel, e] : files_)
    if (!verified_.count(rel)) read(rel, true);
}

// As artifact/reader.py's _read_file: a package's member of that name, or a directory's
// regular file reached without following a symlink; nullopt where there is none.
std::optional<std::string> Artifact::read_unlisted(const std::string& name, size_t limit) const {
  if (package_) {
    if (!package_->member(name)) return std::nullopt;
  } else {
    struct stat st;
    if (::fstatat(dirfd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT)
      return std::nullopt;
  }
  Opened f = open_file(name);
  if (f.size > limit)
    throw ArtifactError(name + " is larger than aotc reads", where(name),
                        "at most " + std::to_string(limit) + " bytes",
                        std::to_string(f.size) + " bytes", "re-export the model");
  return read_at(f.fd, f.base, size_t(f.size), where(name), kDamaged);
}

std::string Artifact::whole_sha256(const std::string& rel) const {
  Opened f = open_listed(rel, files_.at(rel).size);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL's SHA-256 failed");
  constexpr uint64_t kBlock = 1 << 24;
  for (uint64_t at = 0; at < f.size; at += kBlock) {
    std::string block = read_at(f.fd, f.base + at, size_t(std::min(kBlock, f.size - at)), where(rel), kDamaged);
    EVP_DigestUpdate(ctx.get(), block.data(), block.size());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) out += kHex[digest[i] >> 4], out += kHex[digest[i] & 15];
  return out;
}

namespace {

// The entries under directory `fd` (closed here) whose relative names `keep` accepts, depth
// first; directories are entered (not symlinks to them), at most 16 deep.
void walk(int fd, const std::string& prefix, int depth, const std::function<bool(const std::string&, bool)>& keep,
          std::vector<std::string>& out, size_t limit) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::fdopendir(fd), ::closedir);
  if (!d) {
    ::close(fd);
    return;
  }
  while (dirent* e = ::readdir(d.get())) {
    std::string name = e->d_name, rel = prefix + name;
    struct stat st;
    if (name == "." || name == ".." || ::fstatat(::dirfd(d.get()), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      continue;
    bool dir = S_ISDIR(st.st_mode);
    if (!keep(rel, dir)) continue;
    if (!dir) {
      if (out.size() < limit) out.push_back(rel);
      continue;
    }
    int sub = ::openat(::dirfd(d.get()), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0 && depth < 16) walk(sub, rel + "/", depth + 1, keep, out, limit);
    else if (sub >= 0) ::close(sub);
  }
}

}  // namespace

std::vector<std::string> Artifact::unlisted(const std::vector<std::string>& skipped,
                                            const std::vector<std::string>& ignored, size_t limit) const {
  std::vector<std::string> out;
  if (package_) return out;
  int fd = ::openat(dirfd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return out;
  auto keep = [&](const std::string& rel, bool dir) {
    bool top = rel.find('/') == std::string::npos;
    auto in = [&](const std::vector<std::string>& names) {
      return top && std::find(names.begin(), names.end(), rel) != names.end();
    };
    if (dir) return !in(skipped);   // OMS never enters .git and its kin at the top
    return !in(ignored) && rel != "manifest.json" && !files_.count(rel);
  };
  walk(fd, "", 0, keep, out, limit);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace aotc::fe
