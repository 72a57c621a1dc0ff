// Signed artifacts in the C++ front end: artifact/signing.py's check, with its rules and its
// messages. This header: signatures.json (Ed25519) and the check that also tries model.sig
// (OMS bundles: oms.h).
//
// With no trust policy (LoadOptions.trusted_keys not given, AOTC_TRUSTED_KEYS unset or empty)
// no signature is required and signatures.json is not read. With trusted keys, signatures.json
// (beside the manifest, never listed in it; at most 1 MiB) is read and checked field by field
// as Python checks it, each signature is verified over the manifest's exact bytes,
// and loading goes on only where one that verifies is by a trusted key, i.e. its public key's
// key id is a trusted key's and the key id the entry claims is that same id. All of this runs
// after the manifest's own checks and before any other file of the artifact is read.
//
//   signatures.json: {"format": 1, "signatures": [{"algorithm": "ed25519", "key_id": <hex16>,
//                     "public_key": <base64 of the 32 raw bytes>, "signature": <base64>}]}
//
// The JSON reader is json.h's (nlohmann/json): a document it refuses (bad syntax, nesting
// beyond 64, numbers beyond 64 bits, escaped lone surrogates, a text that is not UTF-8, which
// includes UTF-16 and UTF-32; a UTF-8 byte-order mark is skipped, as Python skips it) is an
// ArtifactError with its own message; no signatures.json `aotc sign` writes is among them.
// Signatures are verified by OpenSSL's libcrypto (EVP, Ed25519), the library under the
// `cryptography` package that Python verifies with, so both give the same verdict on every
// input.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rules.h"

namespace aotc::fe {

class Artifact;

using rules::kMaxSignatures;   // artifact/schema/rules.py MAX_SIGNATURES

constexpr size_t kEd25519KeyBytes = 32;
constexpr size_t kEd25519SignatureBytes = 64;

// Whether `signature` (64 bytes) is `public_key`'s (32 bytes) Ed25519 signature of `message`
// (RFC 8032, pure): any other length is simply not a valid signature.
bool ed25519_verify(std::string_view public_key, std::string_view signature,
                    std::string_view message);

constexpr size_t kMaxSignaturesFile = 1 << 20;

struct Signature {   // one entry of signatures.json, its texts as written (base64 not decoded)
  std::string key_id, public_key, signature;
};

// The signatures beside the manifest, checked for form (not yet verified); none where there
// is no signatures.json.
std::vector<Signature> read_signatures(const Artifact& art);

// key id -> whether its signature over `manifest` verifies (artifact/signing.py
// verified_signers: an entry that does not verify counts under the key id it claims).
std::map<std::string, bool> verified_signers(std::string_view manifest,
                                             const std::vector<Signature>& signatures);

// Who signed the artifact among the trusted keys, as artifact/signing.py check_signature says
// it: "OMS key ID" for model.sig verified by a trusted EC key (oms.h), else the key id of a
// trusted Ed25519 key that signed signatures.json (the first in sorted order); "" when no key
// is trusted. UsageError for a trusted key that is neither (keys.h); ArtifactError when keys
// are trusted and no signature by one of them verifies (the first refusal Python gives).
// A policy that names keys and yields none (trusted_keys given empty, AOTC_TRUSTED_KEYS ":" or
// a directory with no key file) is an ArtifactError on every load: it fails closed.
std::string check_signature(const Artifact& art,
                            const std::optional<std::vector<std::string>>& trusted_keys);

}  // namespace aotc::fe
