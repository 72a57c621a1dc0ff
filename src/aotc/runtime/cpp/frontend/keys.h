// Trusted Ed25519 public keys for the C++ front end, read as artifact/signing.py reads them.
//
// A key is given as Python's public_key_bytes() takes a str: the path of a key file (read
// unless the text starts with "-----"), PEM text, base64 text of the 32 raw bytes, or the 32
// raw bytes themselves; a file holds PEM or base64. PEM is a "PUBLIC KEY" block holding an
// Ed25519 SubjectPublicKeyInfo (RFC 8410: DER 302a300506032b6570032100 and the 32 bytes, the
// only DER form of one), as `aotc keygen` writes it. AOTC_TRUSTED_KEYS names key files and
// directories (whose *.pub, *.pem and *.crt files are keys), separated by ':'. What is no key is a
// UsageError with Python's message.
//
// A trust anchor (artifact/trust.py anchors_of) is either such an Ed25519 key or an elliptic-
// curve public key on P-256, P-384 or P-521 (a PEM "PUBLIC KEY" block, read by OpenSSL), which
// verifies OMS bundles (model.sig, oms.h) by the key method, or a certificate (each of a PEM
// file's "CERTIFICATE" blocks, read by OpenSSL), a trust root of OMS's certificate method.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace aotc::fe {

constexpr const char* kTrustedKeysEnv = "AOTC_TRUSTED_KEYS";

// base64 as Python's base64.b64decode(text, validate=True) decodes it (CPython 3.11's
// binascii strict mode): the standard alphabet only, no whitespace, no leading '=', nothing
// but '=' once padding began; padding after two or three characters must complete their
// group and end the text, after a whole group it is skipped ("AAAA=" is 3 bytes); set bits
// past the last byte are ignored. False where Python raises binascii.Error.
bool b64decode_strict(std::string_view text, std::string& out);

// The 32 raw bytes of a trusted key (see above); `is_path`: `key` names a file (an entry of
// AOTC_TRUSTED_KEYS), whose bytes are the key.
std::string public_key_bytes(const std::string& key, bool is_path = false);

// The key files AOTC_TRUSTED_KEYS names, in Python's order (a directory's files sorted);
// nullopt where it is unset or empty (names no key), an empty list where it names keys but
// yields none (":", a directory with no *.pub, *.pem or *.crt), which check_signature refuses.
std::optional<std::vector<std::string>> trusted_from_env();

struct Anchor {
  std::string kind;     // "ed25519" (raw: the 32 key bytes), "ec" (raw: its PEM SPKI) or
                        // "certificate" (raw: its DER)
  std::string raw;
  std::string key_id;   // key_id(raw); a certificate's: its subject (RFC 4514)
};

// The anchors one trusted key stands for, as artifact/trust.py anchors_of reads it (`is_path`:
// as public_key_bytes).
std::vector<Anchor> anchors_of(const std::string& key, bool is_path = false);

// A certificate's subject as cryptography's rfc4514_string() writes it, at most 200
// characters ("an unnamed certificate" for an empty one when `unnamed`).
std::string subject_of(const void* x509, bool unnamed = true);

// artifact/signing.py key_id: the first 16 hex digits of sha256 of the 32 raw bytes.
std::string key_id(std::string_view raw);

}  // namespace aotc::fe
