// The strict JSON reader (json.h).
#include "json.h"

#include <cmath>
#include <cstdlib>
#include <unordered_set>

namespace aotc::json {

namespace {

class Parser {
 public:
  Parser(std::string_view text, const std::string& file) : t_(text), file_(file) {}

  Value document() {
    Value v = value(0);
    space();
    if (p_ != t_.size()) fail("the end of the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) {
    throw ArtifactError(file_ + " is not valid JSON", file_ + ", byte " + std::to_string(p_),
                        expected, p_ < t_.size() ? "'" + std::string(1, t_[p_]) + "'" : "the end",
                        "re-export the model; do not edit artifacts by hand");
  }
  void space() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\r' || t_[p_] == '\t'))
      ++p_;
  }
  bool eat(char c) {
    space();
    if (p_ < t_.size() && t_[p_] == c) return ++p_, true;
    return false;
  }
  void literal(const char* word) {
    for (const char* c = word; *c; ++c, ++p_)
      if (p_ >= t_.size() || t_[p_] != *c) fail(std::string("'") + word + "'");
  }

  Value value(size_t depth) {
    if (depth > kMaxDepth) fail("at most 64 levels of nesting");
    space();
    if (p_ >= t_.size()) fail("a value");
    Value v;
    char c = t_[p_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return v.type = Value::Type::String, v.s = string(), v;
    if (c == 't') return literal("true"), v.type = Value::Type::Bool, v.b = true, v;
    if (c == 'f') return literal("false"), v.type = Value::Type::Bool, v;
    if (c == 'n') return literal("null"), v;
    return number();
  }

  Value object(size_t depth) {
    Value v;
    v.type = Value::Type::Object;
    ++p_;
    if (eat('}')) return v;
    std::unordered_set<std::string> keys;
    do {
      space();
      if (p_ >= t_.size() || t_[p_] != '"') fail("a member name");
      std::string key = string();
      if (!keys.insert(key).second) fail("no duplicate member \"" + key.substr(0, 80) + "\"");
      if (!eat(':')) fail("':'");
      v.members.emplace_back(std::move(key), value(depth + 1));
    } while (eat(','));
    if (!eat('}')) fail("',' or '}'");
    return v;
  }

  Value array(size_t depth) {
    Value v;
    v.type = Value::Type::Array;
    ++p_;
    if (eat(']')) return v;
    do v.items.push_back(value(depth + 1));
    while (eat(','));
    if (!eat(']')) fail("',' or ']'");
    return v;
  }

  unsigned hex4() {
    if (p_ + 4 > t_.size()) fail("four hex digits");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k, ++p_) {
      char h = t_[p_];
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("a hex digit");
      u = u * 16 + unsigned(d);
    }
    return u;
  }

  void utf8(std::string& out, unsigned u) {
    if (u < 0x80) {
      out += char(u);
    } else if (u < 0x800) {
      out += char(0xC0 | (u >> 6)), out += char(0x80 | (u & 0x3F));
    } else if (u < 0x10000) {
      out += char(0xE0 | (u >> 12)), out += char(0x80 | ((u >> 6) & 0x3F));
      out += char(0x80 | (u & 0x3F));
    } else {
      out += char(0xF0 | (u >> 18)), out += char(0x80 | ((u >> 12) & 0x3F));
      out += char(0x80 | ((u >> 6) & 0x3F)), out += char(0x80 | (u & 0x3F));
    }
  }

  void escape(std::string& out) {
    char e = t_[p_++];
    static const char kFrom[] = "\"\\/bfnrt", kTo[] = "\"\\/\b\f\n\r\t";
    for (int k = 0; k < 8; ++k)
      if (e == kFrom[k]) return void(out += kTo[k]);
    if (e != 'u') --p_, fail("a JSON escape");
    unsigned u = hex4();
    if (u >= 0xD800 && u < 0xDC00) {   // a surrogate pair
      if (p_ + 2 > t_.size() || t_[p_] != '\\' || t_[p_ + 1] != 'u') fail("a low surrogate");
      p_ += 2;
      unsigned lo = hex4();
      if (lo < 0xDC00 || lo >= 0xE000) fail("a low surrogate");
      u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
    } else if (u >= 0xDC00 && u < 0xE000) {
      fail("no lone low surrogate");
    }
    utf8(out, u);
  }

  std::string string() {
    ++p_;
    std::string out;
    while (true) {
      if (p_ >= t_.size()) fail("a closing '\"'");
      char c = t_[p_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) --p_, fail("no control character in a string");
      if (c == '\\') {
        if (p_ >= t_.size()) fail("an escape");
        escape(out);
      } else {
        out += c;
      }
    }
  }

  Value number() {
    size_t start = p_;
    bool integral = true;
    if (t_[p_] == '-') ++p_;
    if (p_ >= t_.size() || !isdigit(t_[p_])) fail("a value");
    if (t_[p_] == '0' && p_ + 1 < t_.size() && isdigit(t_[p_ + 1])) fail("no leading zero");
    while (p_ < t_.size() && isdigit(t_[p_])) ++p_;
    if (p_ < t_.size() && t_[p_] == '.') {
      integral = false, ++p_;
      if (p_ >= t_.size() || !isdigit(t_[p_])) fail("a digit after '.'");
      while (p_ < t_.size() && isdigit(t_[p_])) ++p_;
    }
    if (p_ < t_.size() && (t_[p_] == 'e' || t_[p_] == 'E')) {
      integral = false, ++p_;
      if (p_ < t_.size() && (t_[p_] == '+' || t_[p_] == '-')) ++p_;
      if (p_ >= t_.size() || !isdigit(t_[p_])) fail("an exponent");
      while (p_ < t_.size() && isdigit(t_[p_])) ++p_;
    }
    std::string text(t_.substr(start, p_ - start));
    Value v;
    errno = 0;
    if (integral) {
      v.type = Value::Type::Int;
      v.i = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) p_ = start, fail("an integer within 64 bits");
    } else {
      v.type = Value::Type::Float;
      v.f = std::strtod(text.c_str(), nullptr);
      if (!std::isfinite(v.f)) p_ = start, fail("a finite number");
    }
    return v;
  }
  static bool isdigit(char c) { return c >= '0' && c <= '9'; }

  std::string_view t_;
  const std::string& file_;
  size_t p_ = 0;
};

const char* type_name(Value::Type t) {
  static const char* kNames[] = {"null", "a boolean", "an integer", "a number", "a string",
                                 "an array", "an object"};
  return kNames[static_cast<int>(t)];
}

}  // namespace

Value parse(std::string_view text, const std::string& file, size_t max_bytes) {
  if (text.size() > max_bytes)
    throw ArtifactError(file + " is too large", file, "at most " + std::to_string(max_bytes) +
                        " bytes", std::to_string(text.size()) + " bytes", "re-export the model");
  return Parser(text, file).document();
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
