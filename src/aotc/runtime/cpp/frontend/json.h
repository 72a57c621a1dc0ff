// The C++ front end's strict JSON reader (nlohmann/json underneath): the manifest, runner
// files, signatures.json, a package's index.
//
// `parse` accepts RFC 8259 JSON only, in UTF-8 (no comments, trailing commas, NaN or
// duplicate keys; integers within 64 bits), bounded in size and nesting depth, and raises an
// ArtifactError naming the file and the byte where it is malformed. `Field` reads a parsed
// document the way artifact/schema/fields.py does: each access names the field it reads
// ("runner/forward.json, field steps[3][2]"), and a value of the wrong kind or out of its range
// raises an ArtifactError with the field, the expected and the found value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "aotc/errors.h"

namespace aotc::json {

struct Value {
  enum class Type : uint8_t { Null, Bool, Int, Float, String, Array, Object };
  Type type = Type::Null;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<Value> items;                          // Array
  std::vector<std::pair<std::string, Value>> members;   // Object, in document order
};

constexpr size_t kMaxDepth = 64;

Value parse(std::string_view text, const std::string& file, size_t max_bytes);

// The one form both front ends quote a value from an artifact in (artifact/schema/fields.py
// short()): compact JSON (no spaces, non-ASCII kept), cut to `limit` characters and "...".
std::string dump(const Value& v, size_t limit = 80);
std::string dump(const std::string& s, size_t limit = 80);
std::string dump(const std::vector<std::string>& items, size_t limit = 1 << 20);
// Characters (code points) of UTF-8 text, as len() of the Python str counts them.
size_t length(std::string_view text);

class Field {
 public:
  Field(const Value& v, const std::string& file, std::string path)
      : v_(&v), file_(&file), path_(std::move(path)) {}

  Field operator[](const char* key) const;     // a required member
  Field operator[](size_t i) const;            // an item (index checked)
  Field operator[](int i) const { return (*this)[size_t(i)]; }
  bool has(const char* key) const;
  const Value& value() const { return *v_; }
  Value::Type type() const { return v_->type; }

  size_t size(size_t max) const;               // an array of at most `max` items
  const std::vector<std::pair<std::string, Value>>& members(size_t max) const;
  int64_t integer(int64_t lo, int64_t hi) const;
  double number() const;
  bool boolean() const;
  const std::string& string(size_t max = 4096) const;
  Field member(const std::string& key, const Value& v) const {
    return {v, *file_, path_.empty() ? key : path_ + "." + key};
  }

  [[noreturn]] void fail(const std::string& expected, const std::string& found) const;
  std::string where() const;
  std::string found() const;   // a short rendering of the value, for messages

 private:
  const Value* v_;
  const std::string* file_;
  std::string path_;
};

}  // namespace aotc::json
