// Field checks shared by plan_check.cpp and manifest_check.cpp: artifact/schema/fields.py's
// accessors (At.obj, str, text, ident, int lists, sizes) over json::Field, each refusal an
// ArtifactError naming the file and field; tables and patterns from rules.h.
#pragma once

#include <algorithm>
#include <array>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "json.h"
#include "plan_check.h"
#include "rules.h"

namespace aotc::fe::checks {

using json::Field;
using json::Value;
using Names = std::set<std::string>;

template <size_t N>
bool in(const std::array<std::string_view, N>& table, std::string_view s) {
  return std::find(table.begin(), table.end(), s) != table.end();
}

template <size_t N>
std::string listed(const std::array<std::string_view, N>& table) {
  std::vector<std::string> out(table.begin(), table.end());
  return json::dump(out, 1 << 20);
}

// fields.py At.obj: every required field, and none outside required and optional (`extra`)
template <size_t R, size_t O>
void keys(const Field& f, const std::array<std::string_view, R>& required,
          const std::array<std::string_view, O>& optional, std::string_view extra = {}) {
  for (const auto& [k, v] : f.members(rules::kMaxList))
    if (!in(required, k) && !in(optional, k) && (extra.empty() || k != extra))
      f.member(k, v).fail("only the fields of this format", json::dump(k));
  for (auto k : required) (void)f[std::string(k).c_str()];
}

inline const std::string& str(const Field& f, size_t max_chars = rules::kMaxStr) {
  if (f.type() != Value::Type::String) f.fail("a string", f.found());
  if (json::length(f.value().s) > max_chars)
    f.fail("a string of at most " + std::to_string(max_chars) + " characters", f.found());
  return f.value().s;
}

template <size_t N>
const std::string& choice(const Field& f, const std::array<std::string_view, N>& table) {
  const std::string& s = str(f);
  if (!in(table, s)) f.fail("one of " + listed(table), f.found());
  return s;
}

// the patterns of rules.h, each compiled once
inline const std::regex& pattern(const char* p) {
  static const std::regex name(rules::kNamePattern), kernel(rules::kKernelNamePattern),
      op(rules::kOpNamePattern), entry(rules::kEntryPattern), arch(rules::kArchPattern);
  return p == rules::kNamePattern ? name : p == rules::kKernelNamePattern ? kernel : p == rules::kOpNamePattern ? op
         : p == rules::kEntryPattern ? entry : arch;
}

inline bool matches(const std::string& s, const char* p) { return std::regex_match(s, pattern(p)); }

inline const std::string& matching(const Field& f, const char* p, size_t max_chars) {
  const std::string& s = str(f, max_chars);
  if (!matches(s, p)) f.fail(std::string("a string matching ") + p, f.found());
  return s;
}

inline const std::string& ident(const Field& f) { return matching(f, rules::kNamePattern, 64); }

// types.py WEIGHT_NAME: 1..1024 characters, no C0 control character or DEL
inline const std::string& weight_name(const Field& f, size_t max_chars) {
  const std::string& s = str(f, std::min<size_t>(max_chars, 1024));
  bool control = std::any_of(s.begin(), s.end(), [](char c) { return uint8_t(c) < 0x20 || c == 0x7f; });
  if (s.empty() || control) f.fail("a name without control characters", f.found());
  return s;
}

// fields.py ASCII_PRINTABLE: text shown to people only
inline const std::string& text(const Field& f, size_t max_chars) {
  const std::string& s = str(f, max_chars);
  if (!std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; }))
    f.fail("printable ASCII text", f.found());
  return s;
}

inline std::vector<int64_t> ints(const Field& f, int64_t hi, bool nullable = false) {
  std::vector<int64_t> out;
  for (size_t i = 0, n = f.size(1 << 16); i < n; ++i)
    out.push_back(nullable && f[i].type() == Value::Type::Null ? -1 : f[i].integer(0, hi));
  return out;
}

inline void size(const Field& f, const Names& symbols, int64_t hi = int64_t(1) << 48) {
  if (f.type() == Value::Type::String) return check_expr(f, symbols, false);
  f.integer(0, hi);
}

inline size_t sizes(const Field& f, const Names& symbols, int64_t hi = int64_t(1) << 48) {
  size_t n = f.size(16);
  for (size_t i = 0; i < n; ++i) size(f[i], symbols, hi);
  return n;
}

}  // namespace aotc::fe::checks
