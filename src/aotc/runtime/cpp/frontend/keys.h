// Trusted Ed25519 public keys for the C++ front end, read as runtime/signing.py reads them.
//
// A key is given as Python's public_key_bytes() takes a str: the path of a key file (read
// unless the text starts with "-----"), PEM text, base64 text of the 32 raw bytes, or the 32
// raw bytes themselves; a file holds PEM or base64. PEM is a "PUBLIC KEY" block holding an
// Ed25519 SubjectPublicKeyInfo (RFC 8410: DER 302a300506032b6570032100 and the 32 bytes, the
// only DER form of one), as `aotc keygen` writes it. AOTC_TRUSTED_KEYS names key files and
// directories (whose *.pub and *.pem files are keys), separated by ':'. What is no key is a
// UsageError with Python's message.
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
// yields none (":", a directory with no *.pub or *.pem), which check_signature refuses.
std::optional<std::vector<std::string>> trusted_from_env();

// runtime/signing.py key_id: the first 16 hex digits of sha256 of the 32 raw bytes.
std::string key_id(std::string_view raw);

}  // namespace aotc::fe
