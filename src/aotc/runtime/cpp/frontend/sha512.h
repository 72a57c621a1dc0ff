// SHA-512 (FIPS 180-4) for Ed25519 verification (ed25519.h), which hashes R || A || message.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace aotc::fe {

class Sha512 {
 public:
  Sha512();
  void update(const void* data, size_t n);
  std::array<uint8_t, 64> digest();   // ends the hash

 private:
  void block(const uint8_t* p);
  uint64_t h_[8];
  uint8_t buf_[128];
  size_t fill_ = 0;
  uint64_t total_ = 0;   // bytes: messages below 2^61 bytes, so the 128-bit length's top half is 0
};

std::array<uint8_t, 64> sha512(const void* data, size_t n);

}  // namespace aotc::fe
