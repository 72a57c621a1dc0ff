// The package reader (package.h): artifact/package.py's Package, rule for rule and message for
// message.
#include "package.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <regex>
#include <set>

#include "files.h"
#include "json.h"

namespace aotc::fe {

namespace {

constexpr char kMagic[] = "AOTCPKG";   // and its NUL: 8 bytes
constexpr uint32_t kLayout = 1;
constexpr uint64_t kHeader = 24, kPage = 4096, kSmall = 64;
constexpr uint64_t kMaxIndex = 64u << 20, kMaxOffset = uint64_t(1) << 62;
constexpr size_t kMaxMembers = 1 << 17;
const char* kFix = "re-pack the artifact with `aotc pack`, or re-copy the package";

// artifact/schema/files.py SHARD: the members mapped in place, page-aligned at any size
bool shard_name(const std::string& name) {
  static const std::regex kShard(R"(weights(-rank[0-9]{1,2})?(-[0-9]{5}-of-[0-9]{5})?\.safetensors)");
  return std::regex_match(name, kShard);
}

uint64_t alignment(const std::string& name, uint64_t size) {
  return size >= kPage || shard_name(name) ? kPage : kSmall;
}

uint64_t aligned(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

std::string hex(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += kHex[c >> 4], out += kHex[c & 15];
  return out;
}

template <typename T>
T little_endian(const std::string& b, size_t at) {
  T v = 0;
  for (size_t i = sizeof(T); i-- > 0;) v = T(v << 8 | static_cast<unsigned char>(b[at + i]));
  return v;
}

std::string n(uint64_t v) { return std::to_string(v); }

}  // namespace

Package::Package(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd_ < 0) {
    std::string err = std::strerror(errno);
    throw ArtifactError("cannot open the package " + path + " (" + err + ")", path,
                        "a package written by `aotc pack`", err, kFix);
  }
  try {
    struct stat st;
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))
      fail(path + " is not a regular file", "header", "a package file", "another kind of file");
    size_ = uint64_t(st.st_size);
    std::string index = read_index();
    parse_index(index);
    check_places(kHeader + index.size());
  } catch (...) {
    ::close(fd_);
    throw;
  }
  for (const auto& [name, m] : rows_) members_[name] = m;
}

Package::~Package() { ::close(fd_); }

const Member* Package::member(const std::string& name) const {
  auto it = members_.find(name);
  return it == members_.end() ? nullptr : &it->second;
}

void Package::fail(const std::string& what, const std::string& name, const std::string& expected,
                   const std::string& found) const {
  throw ArtifactError(what, where(name), expected, found, kFix);
}

// The header checked, the index's bytes.
std::string Package::read_index() {
  std::string head = read_at(fd_, 0, size_t(std::min(size_, kHeader)), path_, kFix);
  if (head.compare(0, 8, std::string(kMagic, 8)) != 0)
    fail("no artifact directory at " + path_ + ": a file that is not an aotc package", "header",
         hex(std::string(kMagic, 8)) + " (hex)", hex(head.substr(0, 8)) + " (hex)");
  if (head.size() < kHeader)
    fail("the package ends inside its header", "header", "at least " + n(kHeader) + " bytes",
         n(head.size()) + " bytes");
  uint32_t layout = little_endian<uint32_t>(head, 8), zero = little_endian<uint32_t>(head, 12);
  if (layout != kLayout)
    fail("package layout " + n(layout) + " is not supported by this aotc", "header",
         "layout " + n(kLayout), n(layout));
  if (zero != 0)
    fail("the package header's reserved field is not zero", "header", "0", n(zero));
  uint64_t length = little_endian<uint64_t>(head, 16), most = std::min(kMaxIndex, size_ - kHeader);
  if (length > most)
    fail("the package index is larger than the package", "index", "at most " + n(most) + " bytes",
         n(length) + " bytes");
  return read_at(fd_, kHeader, size_t(length), path_, kFix);
}

// The index's rows, each name a safe relative path given once (artifact/package.py _parse_index).
void Package::parse_index(const std::string& raw) {
  const std::string file = "package index";
  json::Value doc = json::parse(raw, file, kMaxIndex);
  json::Field root(doc, file, "");
  for (const auto& [key, v] : root.members(16))
    if (key != "members") root.member(key, v).fail("only the fields [\"members\"]", json::dump(key));
  json::Field rows = root["members"];
  std::set<std::string> seen;
  for (size_t i = 0, count = rows.size(kMaxMembers); i < count; ++i) {
    json::Field row = rows[i];
    if (row.size(3) != 3) row.fail("[name, offset, size]", n(row.size(3)) + " items");
    const std::string& name = row[0].string(600);
    std::string shown = name.substr(0, 200);
    if (!safe_path(name))
      fail("package member name " + json::dump(shown, 1 << 10) + " is not a safe relative path", shown,
           "a relative path inside the artifact (letters, digits, _ . -; no ..)", json::dump(shown, 1 << 10));
    if (!seen.insert(name).second)
      fail("package member " + name + " appears twice", name, "distinct names", name + " twice");
    Member m{uint64_t(row[1].integer(0, int64_t(kMaxOffset))), uint64_t(row[2].integer(0, int64_t(kMaxOffset)))};
    rows_.emplace_back(name, m);
  }
  for (const auto& name : seen)   // "a" and "a/b": no directory can hold both (unpack)
    for (size_t slash = name.find('/'); slash != std::string::npos; slash = name.find('/', slash + 1))
      if (seen.count(name.substr(0, slash)))
        fail("package member " + name.substr(0, slash) + " is both a file and a folder",
             name.substr(0, slash), "each name a file or a folder, not both",
             name.substr(0, slash) + " and " + name);
}

// Each member inside the file at its aligned place after the one before (`end`: the index's
// end), zeros between, the last one ending the file (artifact/package.py _placed).
void Package::check_places(uint64_t end) const {
  const std::string* prev = nullptr;
  for (const auto& [name, m] : rows_) {
    if (m.offset < end)
      fail("package member " + name + " overlaps " + (prev ? *prev : std::string("the index")), name,
           "an offset of at least " + n(end), n(m.offset));
    if (m.offset + m.size > size_)
      fail("package member " + name + " lies past the end of the package", name,
           "an end within " + n(size_) + " bytes", "ends at " + n(m.offset + m.size));
    uint64_t want = aligned(end, alignment(name, m.size));
    if (m.offset != want)
      fail("package member " + name + " is not at its aligned place", name, "offset " + n(want), n(m.offset));
    check_zero(end, m.offset, name);
    end = m.offset + m.size, prev = &name;
  }
  if (end != size_)
    fail("the package has " + n(size_ - end) + " bytes after its last member", "end",
         n(end) + " bytes in all", n(size_) + " bytes");
}

void Package::check_zero(uint64_t lo, uint64_t hi, const std::string& name) const {
  if (hi <= lo) return;
  std::string pad = read_at(fd_, lo, size_t(hi - lo), path_, kFix);
  if (std::any_of(pad.begin(), pad.end(), [](char c) { return c != 0; }))
    fail("the padding before package member " + name + " is not zeros", name, "zero bytes", "other bytes");
}

}  // namespace aotc::fe
