// Python reprs for error messages (pyrepr.h).
#include "pyrepr.h"

#include <charconv>
#include <cstdio>

namespace aotc::fe::py {

namespace {

constexpr size_t kShort = 80;   // fields.py short()
constexpr size_t kEnough = 4 * kShort + 8;   // bytes of repr that hold 81 characters

// The code point of the UTF-8 sequence at text[i] (advancing i); text is valid UTF-8 here
// (checked where it was read), and a stray byte is taken as itself.
char32_t next(std::string_view text, size_t& i) {
  auto b = static_cast<unsigned char>(text[i++]);
  int extra = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
  char32_t c = extra ? b & (0x3F >> extra) : b;
  for (; extra && i < text.size(); --extra) c = c << 6 | (static_cast<unsigned char>(text[i++]) & 0x3F);
  return c;
}

bool printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD || (c >= 0xD800 && c < 0xE000)) return false;   // C1, nbsp, shy
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x2064) || c == 0x3000 || c == 0xFEFF) return false;
  return !(c >= 0xE000 && c <= 0xF8FF) && c <= 0x10FFFF;   // private use
}

std::string hex_escape(char32_t c) {
  char buf[16];
  if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
  else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
  else std::snprintf(buf, sizeof buf, "\\U%08x", unsigned(c));
  return buf;
}

char quote_for(std::string_view text) {
  bool single = text.find('\'') != std::string_view::npos;
  bool dbl = text.find('"') != std::string_view::npos;
  return single && !dbl ? '"' : '\'';
}

std::string escaped(char32_t c, char quote) {
  if (c == char32_t(quote) || c == '\\') return std::string("\\") + char(c);
  if (c == '\n') return "\\n";
  if (c == '\r') return "\\r";
  if (c == '\t') return "\\t";
  return "";
}

// repr(float): the shortest digits that read back, fixed for exponents -4..15, else d.ddde+XX.
std::string float_repr(double f) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string s(buf, end), sign;
  if (s[0] == '-') sign = "-", s.erase(0, 1);
  size_t e = s.find('e');
  int exp = std::stoi(s.substr(e + 1));
  std::string digits = s.substr(0, 1) + (e > 1 ? s.substr(2, e - 2) : "");
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    return sign + m + ex;
  }
  if (exp < 0) return sign + "0." + std::string(size_t(-exp - 1), '0') + digits;
  if (digits.size() <= size_t(exp) + 1) return sign + digits + std::string(exp + 1 - digits.size(), '0') + ".0";
  return sign + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
}

void append(std::string& out, const json::Value& v) {
  using T = json::Value::Type;
  if (out.size() > kEnough) return;   // short_repr() keeps 80 characters: the rest is not shown
  switch (v.type) {
    case T::Null: out += "None"; return;
    case T::Bool: out += v.b ? "True" : "False"; return;
    case T::Int: out += std::to_string(v.i); return;
    case T::Float: out += float_repr(v.f); return;
    case T::String: out += repr(v.s); return;
    case T::Array:
      out += '[';
      for (size_t i = 0; i < v.items.size() && out.size() <= kEnough; ++i)
        out += i ? ", " : "", append(out, v.items[i]);
      out += ']';
      return;
    case T::Object:
      out += '{';
      for (size_t i = 0; i < v.members.size() && out.size() <= kEnough; ++i)
        out += i ? ", " : "", out += repr(v.members[i].first), out += ": ", append(out, v.members[i].second);
      out += '}';
      return;
  }
}

}  // namespace

std::string repr(std::string_view text) {
  char quote = quote_for(text);
  std::string out(1, quote);
  for (size_t i = 0; i < text.size();) {
    size_t start = i;
    char32_t c = next(text, i);
    std::string esc = escaped(c, quote);
    if (!esc.empty()) out += esc;
    else if (!printable(c)) out += hex_escape(c);
    else out.append(text.substr(start, i - start));
  }
  return out + quote;
}

std::string bytes_repr(std::string_view bytes) {
  char quote = quote_for(bytes);
  std::string out = std::string("b") + quote;
  for (char ch : bytes) {
    auto c = static_cast<unsigned char>(ch);
    std::string esc = escaped(c, quote);
    if (!esc.empty()) out += esc;
    else if (c < 0x20 || c >= 0x7F) out += hex_escape(c);
    else out += ch;
  }
  return out + quote;
}

std::string list_repr(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + repr(items[i]);
  return out + "]";
}

std::string repr(const json::Value& v) {
  std::string out;
  append(out, v);
  return out;
}

std::string short_repr(const json::Value& v) {
  std::string text = repr(v);
  size_t i = 0, n = 0;
  while (i < text.size() && n < kShort) next(text, i), ++n;
  return i < text.size() ? text.substr(0, i) + "..." : text;
}

size_t length(std::string_view text) {
  size_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace aotc::fe::py
