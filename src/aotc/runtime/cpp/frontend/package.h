// A single-file package (`aotc pack`) as the C++ front end reads it: artifact/package.py's
// layout and every one of its rules, in C++, with its messages.
//
// The file is opened once (no symlink) and its whole layout is checked at open: the magic and
// layout version, the index (strict JSON {"members": [[name, offset, size], ...]}, in offset
// order), each member name a safe relative path and given once, each member inside the file,
// at the next multiple of its alignment after the one before (4096 for weights shards and
// members of at least 4096 bytes, 64 for the others), zeros in between, and nothing after
// the last. Members are then read and mapped in place, from the package's descriptor at their
// offsets (files.h), exactly as the files of a directory are.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace aotc::fe {

struct Member {
  uint64_t offset = 0, size = 0;
};

class Package {
 public:
  explicit Package(const std::string& path);   // ArtifactError for any broken rule
  ~Package();
  Package(const Package&) = delete;
  Package& operator=(const Package&) = delete;

  int fd() const { return fd_; }
  const Member* member(const std::string& name) const;   // null when there is none
  // (name, member) in the index's (offset) order
  const std::vector<std::pair<std::string, Member>>& rows() const { return rows_; }
  std::string where(const std::string& name) const { return path_ + ":" + name; }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& name,
                         const std::string& expected, const std::string& found) const;
  std::string read_index();
  void parse_index(const std::string& raw);
  void check_places(uint64_t end) const;
  void check_zero(uint64_t lo, uint64_t hi, const std::string& name) const;

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::vector<std::pair<std::string, Member>> rows_;
  std::map<std::string, Member> members_;
};

}  // namespace aotc::fe
