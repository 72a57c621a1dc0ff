// OpenSSF Model Signing bundles (model.sig) in the C++ front end: runtime/oms.py's verification
// by the key method, with its rules and its refusals (the templates of rules.h).
//
// model.sig is a Sigstore bundle (JSON, at most rules::kMaxBundle bytes) holding a DSSE envelope
// over an in-toto statement. The bundle is read as the `model-signing` library reads it (its
// fields and their kinds; anything else is OMS_MALFORMED; transparency-log entries are
// OMS_KEYLESS). Each trusted EC key then checks it as the library's key method does: the media
// type, the key hint (sha256 of the key's PEM), the ECDSA signature (SHA-256, -384 or -512 by
// the curve, OpenSSL's EVP) over the DSSE pre-authentication encoding of the payload, the
// payload type, the statement's type, predicate type, single subject and its root digest over
// the resources' digests; a bundle no key verifies is OMS_UNTRUSTED. The statement of a bundle
// that verifies must hash by whole files with sha256 and list exactly manifest.json and every
// file the manifest lists, each with its sha256 (the manifest's digest, or the whole file's for
// a file hashed by chunks), and nothing else in the artifact's folder (model.sig,
// signatures.json and git's files aside): otherwise OMS_NOT_EXACT, naming what differs.
//
// Where the library is lenient this front end is stricter, never looser: standard base64 only,
// resource names compared as written (no path normalisation), and neither the certificate
// method nor pre-1.0 bundles (the v0.1 predicate, the pre-1.0 PAE) are verified here.
#pragma once

#include <string>
#include <vector>

#include "keys.h"

namespace aotc::fe {

class Artifact;

constexpr const char* kOmsSignature = "model.sig";   // runtime/format.py OMS_SIGNATURE

// The signer ("OMS key ID") of bundle `data` among the EC `anchors`, after its statement was
// checked against the artifact; ArtifactError otherwise (see above).
std::string verify_oms(const Artifact& art, const std::string& data,
                       const std::vector<Anchor>& anchors);

}  // namespace aotc::fe
