// The size-expression grammar (artifact/schema/expr.py) in C++, as a check: the same tokens,
// the same recursive descent with the same node and depth limits (rules.h), declared symbols
// only. It builds nothing: the C++ runner evaluates the postfix form its runner file carries.
#include <algorithm>
#include <cstring>
#include <regex>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "plan_check.h"
#include "rules.h"

namespace aotc::fe {

namespace {

struct Tok {
  bool number = false;
  std::string text;
};

struct ExprError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool blank(char c) { return c && std::strchr(" \t\n\r\f\v", c) != nullptr; }

std::vector<Tok> tokens(std::string_view text) {
  while (!text.empty() && blank(text.back())) text.remove_suffix(1);
  std::vector<Tok> out;
  size_t pos = 0;
  auto name = [](char c, bool first) {
    return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (!first && c >= '0' && c <= '9');
  };
  while (pos < text.size()) {
    size_t at = pos;
    while (at < text.size() && blank(text[at])) ++at;
    if (at == text.size()) throw ExprError("unexpected character at " + std::to_string(pos));
    size_t end = at;
    Tok t;
    char c = text[at];
    if (c >= '0' && c <= '9') {
      while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
      std::string digits(text.substr(at, end - at));   // as Python's int(): 19 digits at most
      if (digits.size() > 19 || (digits.size() == 19 && digits > "9223372036854775807"))
        throw ExprError("an integer does not fit in 63 bits");
      t.number = true, t.text = digits;
    } else if (name(c, true)) {
      while (end < text.size() && name(text[end], false)) ++end;
      t.text = std::string(text.substr(at, end - at));
    } else {
      std::string_view two = text.substr(at, 2);
      if (two == "//" || two == "==" || two == "!=" || two == "<=" || two == ">=") {
        end = at + 2;
      } else if (std::strchr("-+*%<>(),", c) && c) {
        end = at + 1;
      } else {
        throw ExprError("unexpected character at " + std::to_string(at));
      }
      t.text = std::string(text.substr(at, end - at));
    }
    out.push_back(std::move(t));
    pos = end;
  }
  return out;
}

bool keyword(const std::string& s) {
  return std::find(rules::kExprKeywords.begin(), rules::kExprKeywords.end(), s) != rules::kExprKeywords.end();
}

// A parsed node is only its kind here: boolean (a comparison, and / or / not) or not.
class Parser {
 public:
  Parser(std::vector<Tok> toks, const std::set<std::string>& symbols) : t_(std::move(toks)), symbols_(symbols) {}

  bool disj(size_t d) { return chain({"or"}, &Parser::conj, d); }
  bool sum(size_t d) { return chain({"+", "-"}, &Parser::product, d); }
  bool done() const { return pos_ >= t_.size(); }

 private:
  const Tok* peek() const { return pos_ < t_.size() ? &t_[pos_] : nullptr; }
  bool at(const char* s) const { return peek() && !peek()->number && peek()->text == s; }
  bool at_any(std::initializer_list<const char*> ops) const {
    return std::any_of(ops.begin(), ops.end(), [&](const char* o) { return at(o); });
  }
  const Tok& take(const char* want = nullptr) {
    if (!peek() || (want && !at(want))) throw ExprError(std::string("expected ") + (want ? want : "more"));
    return t_[pos_++];
  }
  bool node(bool boolean, size_t depth) {
    if (++nodes_ > rules::kExprMaxNodes || depth > rules::kExprMaxDepth)
      throw ExprError("expression too large or too deep");
    return boolean;
  }
  bool chain(std::initializer_list<const char*> ops, bool (Parser::*sub)(size_t), size_t d) {
    bool left = (this->*sub)(d + 1);
    while (at_any(ops)) {
      bool arith = !at("or") && !at("and");
      take();
      (this->*sub)(d + 1);
      left = node(!arith, d);
    }
    return left;
  }
  bool conj(size_t d) { return chain({"and"}, &Parser::neg, d); }
  bool neg(size_t d) {
    if (at("not")) {
      take();
      neg(d + 1);
      return node(true, d);
    }
    bool left = sum(d + 1);
    if (at_any({"==", "!=", "<", "<=", ">", ">="})) {
      take();
      sum(d + 1);
      left = node(true, d);
    }
    return left;
  }
  bool product(size_t d) { return chain({"*", "//", "%"}, &Parser::unary, d); }
  bool unary(size_t d) {
    if (at("-")) {
      take();
      unary(d + 1);
      return node(false, d);
    }
    return atom(d + 1);
  }
  bool atom(size_t d) {
    const Tok& tok = take();
    if (tok.number) return node(false, d);
    if (tok.text == "(") {
      bool inner = disj(d + 1);
      take(")");
      return inner;
    }
    if (tok.text == "min" || tok.text == "max") {
      take("(");
      sum(d + 1);
      size_t n = 1;
      for (; at(","); ++n) take(), sum(d + 1);
      take(")");
      if (n < 2) throw ExprError(tok.text + "() needs at least two arguments");
      return node(false, d);
    }
    static const std::regex kName(rules::kNamePattern);
    if (std::regex_match(tok.text, kName) && !keyword(tok.text)) {
      if (!symbols_.count(tok.text)) throw ExprError("'" + tok.text + "' is not a declared size symbol");
      return node(false, d);
    }
    throw ExprError("unexpected token '" + tok.text + "'");
  }

  std::vector<Tok> t_;
  const std::set<std::string>& symbols_;
  size_t pos_ = 0, nodes_ = 0;
};

}  // namespace

void check_expr(const json::Field& f, const std::set<std::string>& symbols, bool boolean) {
  if (f.type() != json::Value::Type::String) f.fail("an expression string", f.found());
  const std::string& text = f.value().s;
  try {
    if (json::length(text) > rules::kExprMaxText) throw ExprError("expression too long");
    Parser p(tokens(text), symbols);
    bool b = boolean ? p.disj(0) : p.sum(0);
    if (!p.done()) throw ExprError("unexpected token after the expression");
    if (b != boolean) throw ExprError(boolean ? "expected a comparison" : "expected an integer expression");
  } catch (const ExprError& e) {
    f.fail("integer arithmetic (+ - * // % min max) over declared symbols",
           f.found() + " (not a valid size expression: " + e.what() + ")");
  }
}

}  // namespace aotc::fe
