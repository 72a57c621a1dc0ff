// signing: what tests/test_cpp_signing.py holds against Python's artifact/signing.py.
//
//   signing load [-n] ART [-e] [KEY ...]  aotc::Module(ART) with the KEYs trusted (-n:
//                                    verify_hashes off; -e: trusted_keys given, even if no KEY
//                                    follows), one forward call; prints "signer ID" (ID empty where
//                                    none was required), or "Kind: message" and exits with the
//                                    error's exit code
//   signing check                    one answer per line of stdin (fields hex, "-" for none):
//     verify PUB SIG MSG             1 or 0: ed25519_verify (OpenSSL)
//     b64 TEXT                       "ok HEX" (b64decode_strict), or "error"
//     key TEXT                       "ok HEX" (public_key_bytes), or "Kind<TAB>what<TAB>found"
#include <aotc/module.h>
#include <ATen/ATen.h>

#include <iostream>
#include <sstream>
#include <string>

#include "frontend/keys.h"
#include "frontend/signing.h"

namespace {

std::string unhex(const std::string& h) {
  std::string out;
  if (h == "-") return out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::string hex(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += kHex[c >> 4], out += kHex[c & 15];
  return out;
}

std::string answer(const std::string& line) {
  std::istringstream in(line);
  std::string cmd, a, b, c;
  in >> cmd >> a >> b >> c;
  if (cmd == "verify") return aotc::fe::ed25519_verify(unhex(a), unhex(b), unhex(c)) ? "1" : "0";
  std::string out;
  if (cmd == "b64") return aotc::fe::b64decode_strict(unhex(a), out) ? "ok " + hex(out) : "error";
  if (cmd == "key") try {
      return "ok " + hex(aotc::fe::public_key_bytes(unhex(a)));
    } catch (const aotc::AotcError& e) {
      return std::string(e.kind()) + "\t" + e.message() + "\t" + e.found();
    }
  return "unknown command " + cmd;
}

int load(int argc, char** argv) {
  aotc::LoadOptions options;
  int i = 2;
  if (i < argc && std::string(argv[i]) == "-n") options.verify_hashes = false, ++i;
  if (i >= argc) return std::cerr << "usage: signing load [-n] ART [-e] [KEY ...]\n", 2;
  std::string art = argv[i++];
  bool given = i < argc && std::string(argv[i]) == "-e";   // the keys given, even if none
  if (given || i < argc) options.trusted_keys.emplace();
  for (i += given; i < argc; ++i) options.trusted_keys->push_back(argv[i]);
  aotc::Module m(art, options);
  m.forward(m.example_inputs());
  std::cout << "signer " << m.signer() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "load") return load(argc, argv);
  if (mode != "check") return std::cerr << "usage: signing load|check ...\n", 2;
  for (std::string line; std::getline(std::cin, line);) std::cout << answer(line) << "\n";
  return 0;
} catch (const aotc::AotcError& e) {
  std::cerr << e.kind() << ": " << e.what() << "\n";
  return e.exit_code();
}
