// An artifact as the C++ front end reads it (artifact/reader.py's rules in C++): a directory,
// or a package file (package.h) whose members stand for the files of the same names.
//
// The directory is opened once; every file is opened relative to it one component at a time,
// never following a symlink, regular files only, and only if the manifest lists it under a
// path of the schema's safe form. A package is opened once and its layout checked; a member
// is then read or mapped from the package's descriptor at its offset, the manifest's and
// signatures.json aside every member must be a file the manifest lists, and every listed file
// must be a member (as every listed file must exist in a directory), with its listed size. The manifest's self-hash is checked over its own bytes (the
// canonical form the exporter wrote, minus its manifest_sha256 line) and its format version
// against this front end's. Each file is checked against its size and sha256 (or its chunk
// digests, chunks hashed in parallel) from the bytes that are then used: small files read into
// memory, weights shards mapped privately and hashed from that mapping.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "json.h"

namespace aotc::fe {

class Package;

constexpr int kFormatVersion = 26;   // artifact/format.py FORMAT_VERSION this front end reads
constexpr int kRunnerFormat = 10;    // the first with runner files (11, 12: CUDA, decode args;
                                     // 13: kernel arguments' shapes, required for kernel steps)
constexpr int kCudaRunnerFormat = 14;   // the first whose CUDA artifacts have runner files

struct FileEntry {
  uint64_t size = 0;
  std::string sha256;                 // or:
  uint64_t chunk = 0;                 // chunk size, with one sha256 per chunk
  std::vector<std::string> chunks;
};

// Verified bytes of one file: a private (copy-on-write) mapping or a heap copy.
struct Bytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::string heap;
  void* map = nullptr;
  size_t map_size = 0;   // from the page boundary at or before `data`
  ~Bytes();
};

class Artifact {
 public:
  Artifact(const std::string& path, bool verify_hashes);
  ~Artifact();
  Artifact(const Artifact&) = delete;
  Artifact& operator=(const Artifact&) = delete;

  const json::Value& manifest() const { return manifest_; }
  const std::string& manifest_bytes() const { return manifest_bytes_; }   // as read and hashed
  json::Field field() const { return {manifest_, manifest_name_, ""}; }
  int version() const { return version_; }
  // "ROOT/rel" for a directory, "ROOT:rel" for a package (as Python names them)
  std::string where(const std::string& rel) const;
  bool listed(const std::string& rel) const { return files_.count(rel) != 0; }
  // A listed file's verified bytes (`mapped`: a private mapping, for weights shards).
  std::shared_ptr<const Bytes> read(const std::string& rel, bool mapped = false) const;
  // Checks every listed file that no read() has checked yet (its size and digests), as
  // Python's loader checks every file: each file is hashed once.
  void verify_unread() const;
  // Every listed file exists (a package's member, a directory's regular file) with its listed
  // size; Module calls it after the signature check, as Python checks the files after it.
  void check_listed() const;
  // A file of the format the manifest does not list (signatures.json) at the artifact's top,
  // opened as listed ones are, at most `limit` bytes; nullopt where there is none.
  std::optional<std::string> read_unlisted(const std::string& name, size_t limit) const;
  const std::map<std::string, FileEntry>& files() const { return files_; }
  // sha256 of a listed file's whole bytes (its size checked, its digests not: oms.cpp compares
  // it with a signed one), for a file the manifest hashes by chunks.
  std::string whole_sha256(const std::string& rel) const;
  // A directory's files (and symlinks) the manifest does not list, sorted, as artifact/oms.py
  // unlisted_files finds them: the manifest and, at the top, `ignored` names aside and the
  // `skipped` folders not entered; at most `limit` of them. None for a package (its members
  // are checked when it is opened).
  std::vector<std::string> unlisted(const std::vector<std::string>& skipped,
                                    const std::vector<std::string>& ignored, size_t limit) const;

 private:
  struct Opened;
  void read_manifest();
  void parse_files();
  void check_members() const;
  Opened open_file(const std::string& rel) const;
  Opened open_listed(const std::string& rel, uint64_t size) const;
  void verify(const std::string& rel, const FileEntry& e, const uint8_t* data) const;

  std::string root_, manifest_name_ = "manifest.json";
  int dirfd_ = -1;
  std::unique_ptr<Package> package_;   // or a directory (dirfd_)
  bool verify_ = true;
  int version_ = 0;
  json::Value manifest_;
  std::string manifest_bytes_;
  std::map<std::string, FileEntry> files_;
  mutable std::set<std::string> verified_;   // files read() has checked (loading is serial)
};

// sha256 of n bytes as 64 lowercase hex digits (OpenSSL's libcrypto).
std::string sha256_hex(const void* data, size_t n);
bool safe_path(const std::string& rel);   // artifact/schema/manifest.py PATH

// `size` bytes of `fd` from `offset`; an ArtifactError naming `where` (with `fix`) if it ends
// first.
std::string read_at(int fd, uint64_t offset, size_t size, const std::string& where, const char* fix);

}  // namespace aotc::fe
