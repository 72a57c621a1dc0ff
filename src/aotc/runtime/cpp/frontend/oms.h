// OpenSSF Model Signing bundles (model.sig) in the C++ front end: artifact/oms.py's verification
// by the key and certificate methods, with its rules and its refusals (the templates of
// rules.h).
//
// model.sig is a Sigstore bundle (JSON, at most rules::kMaxBundle bytes) holding a DSSE envelope
// over an in-toto statement. The bundle is read as the `model-signing` library reads it (its
// fields and their kinds; anything else is OMS_MALFORMED; transparency-log entries are
// OMS_KEYLESS). A bundle carrying a certificate chain is checked by the trusted certificates
// (the certificate method: the chain verified up to one of them by OpenSSL's X509_STORE as of
// the signing certificate's start of validity, which must allow signing), any other by the
// trusted EC keys (the key method: the key hint, sha256 of the key's PEM, must name the key).
// Then, as the library does: the ECDSA signature (SHA-256, -384 or -512 by the curve, OpenSSL's
// EVP) over the DSSE pre-authentication encoding of the payload, the payload type, the
// statement's type, predicate type, single subject and its root digest over the resources'
// digests; a bundle nothing trusted verifies is OMS_UNTRUSTED. The statement of a bundle that
// verifies must hash by whole files with sha256 and list exactly manifest.json and every file
// the manifest lists, each with its sha256 (the manifest's digest, or the whole file's for a
// file hashed by chunks), and nothing else in the artifact's folder (model.sig,
// signatures.json and git's files aside): otherwise OMS_NOT_EXACT, naming what differs.
//
// Where the library is lenient this front end is stricter, never looser: standard base64 only,
// resource names compared as written (no path normalisation), and pre-1.0 bundles (the v0.1
// predicate, the pre-1.0 PAE) are not verified here.
#pragma once

#include <string>
#include <vector>

#include "keys.h"

namespace aotc::fe {

class Artifact;

constexpr const char* kOmsSignature = "model.sig";   // artifact/format.py OMS_SIGNATURE

// The signer ("OMS key ID", "OMS certificate SUBJECT") of bundle `data` among `anchors` (EC
// keys and certificates), after its statement was checked against the artifact; ArtifactError
// otherwise (see above).
std::string verify_oms(const Artifact& art, const std::string& data,
                       const std::vector<Anchor>& anchors);

}  // namespace aotc::fe
