// The strict JSON reader (json.h): nlohmann/json's SAX parser (RFC 8259, UTF-8 checked,
// iterative, so deep nesting cannot overflow the stack) builds a Value tree, with aotc's own
// rules on top: a size bound before parsing, a depth bound, no duplicate member, integers within
// 64 bits and finite numbers.
#include "json.h"

#include <cmath>
#include <unordered_set>

#include <nlohmann/json.hpp>

namespace aotc::json {

namespace {

const char* kFix = "re-export the model; do not edit artifacts by hand";

class Builder {
 public:
  explicit Builder(const std::string& file) : file_(file) {}
  using nj = nlohmann::json;

  bool null() { return put(Value{}); }
  bool boolean(bool b) {
    Value v;
    v.type = Value::Type::Bool, v.b = b;
    return put(std::move(v));
  }
  bool number_integer(nj::number_integer_t i) {
    Value v;
    v.type = Value::Type::Int, v.i = i;
    return put(std::move(v));
  }
  bool number_unsigned(nj::number_unsigned_t u) {
    if (u > uint64_t(INT64_MAX)) fail("an integer within 64 bits", std::to_string(u));
    return number_integer(int64_t(u));
  }
  bool number_float(nj::number_float_t f, const std::string& text) {
    if (text.find_first_of(".eE") == std::string::npos) fail("an integer within 64 bits", text.substr(0, 80));
    if (!std::isfinite(f)) fail("a finite number", text.substr(0, 80));
    Value v;
    v.type = Value::Type::Float, v.f = f;
    return put(std::move(v));
  }
  bool string(std::string& s) {
    Value v;
    v.type = Value::Type::String, v.s = std::move(s);
    return put(std::move(v));
  }
  bool binary(nj::binary_t&) { fail("JSON", "binary data"); }
  bool start_object(size_t) { return open(Value::Type::Object); }
  bool start_array(size_t) { return open(Value::Type::Array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    if (!keys_.back().insert(k).second) fail("no duplicate member", "\"" + k.substr(0, 80) + "\" twice");
    key_ = std::move(k);
    return true;
  }
  bool parse_error(size_t at, const std::string& token, const nlohmann::detail::exception& e) {
    // nlohmann's message without its prefix and its "last read" (the raw bytes: the token is
    // given quoted as JSON instead, so that no byte of the file reaches the message as is)
    std::string what = e.what();
    what = what.substr(0, what.find("; last read"));
    if (size_t colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    throw ArtifactError(file_ + " is not valid JSON", file_ + ", byte " + std::to_string(at),
                        "RFC 8259 JSON (" + what + ")", token.empty() ? "the end" : dump(token, 40), kFix);
  }

  Value root;

 private:
  [[noreturn]] void fail(const std::string& expected, const std::string& found) {
    throw ArtifactError(file_ + " is not valid JSON", file_, expected, found, kFix);
  }
  Value* place(Value&& v) {   // where a new value goes: the root, an item or a member
    if (stack_.empty()) return &(root = std::move(v));
    Value& top = *stack_.back();
    if (top.type == Value::Type::Array) return &top.items.emplace_back(std::move(v));
    return &top.members.emplace_back(std::move(key_), std::move(v)).second;
  }
  bool put(Value&& v) { return place(std::move(v)), true; }
  bool open(Value::Type type) {
    if (stack_.size() >= kMaxDepth) fail("at most " + std::to_string(kMaxDepth) + " levels of nesting", "more");
    Value v;
    v.type = type;
    stack_.push_back(place(std::move(v)));
    keys_.emplace_back();
    return true;
  }
  bool close() {
    stack_.pop_back(), keys_.pop_back();
    return true;
  }

  const std::string& file_;
  std::vector<Value*> stack_;   // the open arrays and objects (each inside the one before it)
  std::vector<std::unordered_set<std::string>> keys_;
  std::string key_;
};

const char* type_name(Value::Type t) {
  static const char* kNames[] = {"null", "a boolean", "an integer", "a number", "a string",
                                 "an array", "an object"};
  return kNames[static_cast<int>(t)];
}

nlohmann::ordered_json to_nlohmann(const Value& v) {
  switch (v.type) {
    case Value::Type::Null: return nullptr;
    case Value::Type::Bool: return v.b;
    case Value::Type::Int: return v.i;
    case Value::Type::Float: return v.f;
    case Value::Type::String: return v.s;
    case Value::Type::Array: {
      auto out = nlohmann::ordered_json::array();
      for (const Value& x : v.items) out.push_back(to_nlohmann(x));
      return out;
    }
    default: {
      auto out = nlohmann::ordered_json::object();
      for (const auto& [k, x] : v.members) out[k] = to_nlohmann(x);
      return out;
    }
  }
}

}  // namespace

Value parse(std::string_view text, const std::string& file, size_t max_bytes) {
  if (text.size() > max_bytes)
    throw ArtifactError(file + " is too large", file, "at most " + std::to_string(max_bytes) +
                        " bytes", std::to_string(text.size()) + " bytes", "re-export the model");
  Builder b(file);
  nlohmann::json::sax_parse(text.begin(), text.end(), &b, nlohmann::json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  return std::move(b.root);
}

size_t length(std::string_view text) {
  size_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string dump(const Value& v, size_t limit) {
  std::string text = to_nlohmann(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (length(text) <= limit) return text;
  size_t at = 0;
  for (size_t n = 0; n < limit; ++n)
    for (++at; at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80;) ++at;
  return text.substr(0, at) + "...";
}

std::string dump(const std::string& s, size_t limit) {
  Value v;
  v.type = Value::Type::String, v.s = s;
  return dump(v, limit);
}

std::string dump(const std::vector<std::string>& items, size_t limit) {
  Value v;
  v.type = Value::Type::Array;
  for (const auto& s : items) v.items.push_back(Value{Value::Type::String, false, 0, 0, s, {}, {}});
  return dump(v, limit);
}

std::string Field::where() const { return *file_ + ", field " + (path_.empty() ? "(root)" : path_); }

std::string Field::found() const {
  switch (v_->type) {
    case Value::Type::Int: return std::to_string(v_->i);
    case Value::Type::Bool: return v_->b ? "true" : "false";
    case Value::Type::String: return "\"" + v_->s.substr(0, 80) + "\"";
    default: return type_name(v_->type);
  }
}

void Field::fail(const std::string& expected, const std::string& found) const {
  throw ArtifactError(*file_ + " is malformed at " + (path_.empty() ? "its root" : path_), where(),
                      expected, found, "re-export the model with this aotc (the file was "
                      "damaged or not written by aotc)");
}

Field Field::operator[](const char* key) const {
  if (v_->type != Value::Type::Object) fail("an object", found());
  for (const auto& m : v_->members)
    if (m.first == key) return member(key, m.second);
  fail(std::string("a member \"") + key + "\"", "none");
}

bool Field::has(const char* key) const {
  if (v_->type != Value::Type::Object) return false;
  for (const auto& m : v_->members)
    if (m.first == key) return true;
  return false;
}

Field Field::operator[](size_t i) const {
  if (v_->type != Value::Type::Array) fail("an array", found());
  if (i >= v_->items.size())
    fail("an item #" + std::to_string(i), std::to_string(v_->items.size()) + " items");
  return {v_->items[i], *file_, path_ + "[" + std::to_string(i) + "]"};
}

size_t Field::size(size_t max) const {
  if (v_->type != Value::Type::Array) fail("an array", found());
  if (v_->items.size() > max)
    fail("at most " + std::to_string(max) + " items", std::to_string(v_->items.size()));
  return v_->items.size();
}

const std::vector<std::pair<std::string, Value>>& Field::members(size_t max) const {
  if (v_->type != Value::Type::Object) fail("an object", found());
  if (v_->members.size() > max)
    fail("at most " + std::to_string(max) + " members", std::to_string(v_->members.size()));
  return v_->members;
}

int64_t Field::integer(int64_t lo, int64_t hi) const {
  if (v_->type != Value::Type::Int || v_->i < lo || v_->i > hi)
    fail("an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", found());
  return v_->i;
}

double Field::number() const {
  if (v_->type == Value::Type::Int) return double(v_->i);
  if (v_->type != Value::Type::Float) fail("a number", found());
  return v_->f;
}

bool Field::boolean() const {
  if (v_->type != Value::Type::Bool) fail("true or false", found());
  return v_->b;
}

const std::string& Field::string(size_t max) const {
  if (v_->type != Value::Type::String) fail("a string", found());
  if (v_->s.size() > max) fail("a string of at most " + std::to_string(max) + " bytes", found());
  return v_->s;
}

}  // namespace aotc::json
