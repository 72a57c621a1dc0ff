// SHA-256 (FIPS 180-4) for the C++ front end's file checks: the digests the manifest records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace aotc {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex();   // the digest as 64 lowercase hex digits (ends the hash)

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* data, size_t n);

}  // namespace aotc
