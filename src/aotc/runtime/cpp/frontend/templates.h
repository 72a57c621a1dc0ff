// Errors from the templates both front ends share (rules.h, generated from
// artifact/schema/rules.py): each "{name}" in a template's texts filled from `fields`.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "aotc/errors.h"
#include "rules.h"

namespace aotc::fe {

inline std::string fill(const char* text,
                        std::initializer_list<std::pair<const char*, std::string>> fields) {
  std::string out = text;
  for (const auto& [name, value] : fields) {
    std::string key = std::string("{") + name + "}";
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + value.size()))
      out.replace(at, key.size(), value);
  }
  return out;
}

template <class Error>
[[noreturn]] void raise(const rules::Template& t,
                        std::initializer_list<std::pair<const char*, std::string>> fields = {}) {
  throw Error(fill(t.what, fields), fill(t.where, fields), fill(t.expected, fields),
              fill(t.found, fields), fill(t.fix, fields));
}

}  // namespace aotc::fe
