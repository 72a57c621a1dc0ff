// aotc's error classes in C++, mirroring aotc/errors.py: one hierarchy, each message saying
// what went wrong, where, the value expected and the value found, and one fix, rendered as
// Python renders them ("what\n  where: ...\n  expected: ...\n  found: ...\n  fix: ...").
// `exit_code()` is what the `aotc` CLI exits with for the same class.
#pragma once

#include <stdexcept>
#include <string>

namespace aotc {

class AotcError : public std::runtime_error {
 public:
  AotcError(const std::string& what, std::string where, std::string expected, std::string found,
            std::string fix)
      : std::runtime_error(render(what, where, expected, found, fix)), what_(what),
        where_(std::move(where)), expected_(std::move(expected)), found_(std::move(found)),
        fix_(std::move(fix)) {}
  virtual int exit_code() const { return 1; }
  virtual const char* kind() const { return "AotcError"; }   // the class name, as in Python
  const std::string& message() const { return what_; }   // the first line
  const std::string& where() const { return where_; }
  const std::string& expected() const { return expected_; }
  const std::string& found() const { return found_; }
  const std::string& fix() const { return fix_; }

 private:
  static std::string render(const std::string& what, const std::string& where,
                            const std::string& expected, const std::string& found,
                            const std::string& fix) {
    std::string out = what;
    const std::pair<const char*, const std::string*> parts[] = {
        {"where", &where}, {"expected", &expected}, {"found", &found}, {"fix", &fix}};
    for (const auto& [label, value] : parts)
      if (!value->empty()) out += std::string("\n  ") + label + ": " + *value;
    return out;
  }
  std::string what_, where_, expected_, found_, fix_;
};

#define AOTC_ERROR_CLASS(Name, code)                       \
  class Name : public AotcError {                          \
   public:                                                 \
    using AotcError::AotcError;                            \
    int exit_code() const override { return code; }        \
    const char* kind() const override { return #Name; }    \
  };

AOTC_ERROR_CLASS(UsageError, 2)      // a malformed argument (a path, an option)
AOTC_ERROR_CLASS(ArtifactError, 5)   // missing, damaged, tampered with, unknown format
AOTC_ERROR_CLASS(GuardError, 6)      // an input the guards recorded at export refuse
AOTC_ERROR_CLASS(TargetError, 7)     // built for a device, ISA or format this host cannot run
#undef AOTC_ERROR_CLASS

}  // namespace aotc
