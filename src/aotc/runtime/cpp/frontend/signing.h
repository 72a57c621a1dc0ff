// Signed artifacts in the C++ front end: runtime/signing.py's check, with its rules and its
// messages.
//
// With no trusted key (LoadOptions.trusted_keys empty, AOTC_TRUSTED_KEYS unset or empty) no
// signature is required and signatures.json is not read. With trusted keys, signatures.json
// (beside the manifest, never listed in it; at most 1 MiB) is read and checked field by field
// as Python checks it, each signature is verified over the manifest's exact bytes (ed25519.h),
// and loading goes on only where one that verifies is by a trusted key, i.e. its public key's
// key id is a trusted key's and the key id the entry claims is that same id. All of this runs
// after the manifest's own checks and before any other file of the artifact is read.
//
//   signatures.json: {"format": 1, "signatures": [{"algorithm": "ed25519", "key_id": <hex16>,
//                     "public_key": <base64 of the 32 raw bytes>, "signature": <base64>}]}
//
// The JSON reader is the front end's own (json.h): a document it refuses (bad syntax, nesting
// beyond 64, numbers beyond 64 bits, escaped lone surrogates, a text that is not UTF-8, which
// includes UTF-16 and UTF-32; a UTF-8 byte-order mark is skipped, as Python skips it) is an
// ArtifactError with its own message; no signatures.json `aotc sign` writes is among them.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace aotc::fe {

class Artifact;

constexpr size_t kMaxSignatures = 64;        // runtime/signing.py MAX_SIGNATURES
constexpr size_t kMaxSignaturesFile = 1 << 20;

struct Signature {   // one entry of signatures.json, its texts as written (base64 not decoded)
  std::string key_id, public_key, signature;
};

// The signatures beside the manifest, checked for form (not yet verified); none where there
// is no signatures.json.
std::vector<Signature> read_signatures(const Artifact& art);

// key id -> whether its signature over `manifest` verifies (runtime/signing.py
// verified_signers: an entry that does not verify counts under the key id it claims).
std::map<std::string, bool> verified_signers(std::string_view manifest,
                                             const std::vector<Signature>& signatures);

// The key id of a trusted key that signed the artifact (the first in sorted order); "" when
// no key is trusted. UsageError for a trusted key that is no Ed25519 public key (keys.h);
// ArtifactError when keys are trusted and none of them signed.
std::string check_signature(const Artifact& art, const std::vector<std::string>& trusted_keys);

}  // namespace aotc::fe
