// Ed25519 signature verification (RFC 8032, the pure variant) for signed artifacts (signing.h).
//
// Verify only: nothing here handles a secret, so nothing needs to run in constant time. Every
// input is untrusted and length-checked; the arithmetic is on fixed-size arrays only.
//
// Which signatures verify is exactly what OpenSSL's ED25519_verify accepts, the check behind
// the `cryptography` package's Ed25519PublicKey.verify that aotc's Python loader uses, so the
// two front ends agree on every input:
//   - S must be canonical (S < L): a signature with S + L is refused (malleability);
//   - R is never decoded: [S]B - [k]A is encoded canonically and compared with R's bytes, so a
//     non-canonical R never verifies;
//   - the public key A is decoded as OpenSSL decodes it: a y >= p is taken mod p, and x = 0
//     with the sign bit set is accepted (RFC 8032 5.1.3 refuses both). An artifact's key is
//     only trusted when sha256 of its 32 bytes is a trusted key's id, and a trusted key is a
//     canonical encoding (`aotc keygen` writes one), so this leniency cannot make a signature
//     count as a trusted one; it only decides, as Python does, whether an untrusted one
//     "verifies" in an error message;
//   - no small-order check on A or R (OpenSSL makes none); the equation is the cofactorless
//     one ([S]B = R + [k]A, compared as encodings).
#pragma once

#include <string_view>

namespace aotc::fe {

constexpr size_t kEd25519KeyBytes = 32;
constexpr size_t kEd25519SignatureBytes = 64;

// Whether `signature` (64 bytes) is `public_key`'s (32 bytes) signature of `message`; any
// other length is simply not a valid signature.
bool ed25519_verify(std::string_view public_key, std::string_view signature,
                    std::string_view message);

}  // namespace aotc::fe
