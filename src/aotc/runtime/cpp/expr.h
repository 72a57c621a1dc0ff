// Size expressions as bytecode: what plans write as "2*seq" or "(batch + 3) // 4", and what
// guards write as "seq % 8 == 0", becomes a postfix program over the call's bound symbols. The front end compiles the schema's parsed
// expression nodes (artifact/schema/expr.py) into it; `check` proves at load that a program
// evaluates on the fixed stack, reads only declared symbols and leaves one value, so `eval`
// needs no checks but arithmetic ones: Python's floor division and modulo, an error on
// division by zero and on 64-bit overflow (Python's integers would not overflow: a size that
// does is refused, never wrapped).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace aotc::expr {

enum Op : int64_t { CONST = 0, SYM = 1, NEG = 2, ADD = 3, SUB = 4, MUL = 5, FLOORDIV = 6,
                    MOD = 7, MIN = 8, MAX = 9, EQ = 10, NE = 11, LT = 12, LE = 13, GT = 14,
                    GE = 15, AND = 16, OR = 17, NOT = 18 };
constexpr int kMaxStack = 64;
constexpr size_t kMaxCode = 4096;

// Empty if `code` is a well-formed program over `symbols` symbols, else what is wrong.
inline std::string check(const std::vector<int64_t>& code, int64_t symbols) {
  if (code.empty() || code.size() > kMaxCode) return "an expression of 1 to 4096 codes";
  int depth = 0;
  for (size_t pc = 0; pc < code.size(); ++pc) {
    int64_t op = code[pc];
    if (op == CONST || op == SYM) {
      if (++pc >= code.size()) return "an operand after CONST or SYM";
      if (op == SYM && (code[pc] < 0 || code[pc] >= symbols)) return "a declared symbol";
      if (++depth > kMaxStack) return "at most 64 values on the stack";
    } else if (op == NEG || op == NOT) {
      if (depth < 1) return "an operand for NEG or NOT";
    } else if ((op >= ADD && op <= MOD) || (op >= EQ && op <= OR)) {
      if (depth < 2) return "two operands for a binary operator";
      --depth;
    } else if (op == MIN || op == MAX) {
      if (++pc >= code.size() || code[pc] < 2 || code[pc] > depth)
        return "min/max over at least two values on the stack";
      depth -= static_cast<int>(code[pc]) - 1;
    } else {
      return "a known operator";
    }
  }
  return depth == 1 ? "" : "exactly one value left";
}

[[noreturn]] inline void fail(const char* what) { throw std::overflow_error(what); }

inline int64_t floordiv(int64_t a, int64_t b) {
  if (b == 0) fail("a size expression divides by zero");
  if (a == INT64_MIN && b == -1) fail("a size expression overflows 64 bits");
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

inline int64_t mod(int64_t a, int64_t b) {
  if (b == 0) fail("a size expression divides by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

// The value of a program `check` accepted, with symbols bound by `syms`.
inline int64_t eval(const std::vector<int64_t>& code, const int64_t* syms) {
  int64_t st[kMaxStack];
  int sp = 0;
  for (size_t pc = 0; pc < code.size(); ++pc) {
    int64_t r = 0;
    switch (code[pc]) {
      case CONST: st[sp++] = code[++pc]; continue;
      case SYM: st[sp++] = syms[code[++pc]]; continue;
      case NEG:
        if (st[sp - 1] == INT64_MIN) fail("a size expression overflows 64 bits");
        st[sp - 1] = -st[sp - 1];
        continue;
      case NOT: st[sp - 1] = !st[sp - 1]; continue;
      case MIN: case MAX: {
        int64_t n = code[++pc];
        bool lo = code[pc - 1] == MIN;
        r = st[sp - n];
        for (int64_t k = sp - n + 1; k < sp; ++k) r = lo ? std::min(r, st[k]) : std::max(r, st[k]);
        sp -= static_cast<int>(n);
        st[sp++] = r;
        continue;
      }
      default: break;
    }
    int64_t a = st[sp - 2], b = st[sp - 1];
    bool over = false;
    switch (code[pc]) {
      case ADD: over = __builtin_add_overflow(a, b, &r); break;
      case SUB: over = __builtin_sub_overflow(a, b, &r); break;
      case MUL: over = __builtin_mul_overflow(a, b, &r); break;
      case FLOORDIV: r = floordiv(a, b); break;
      case MOD: r = mod(a, b); break;
      case EQ: r = a == b; break;
      case NE: r = a != b; break;
      case LT: r = a < b; break;
      case LE: r = a <= b; break;
      case GT: r = a > b; break;
      case GE: r = a >= b; break;
      // relations evaluate both sides (Python's `or` may not): an error there is a failed
      // check, which the caller then decides with Python's own evaluation
      case AND: r = a && b; break;
      default: r = a || b; break;
    }
    if (over) fail("a size expression overflows 64 bits");
    st[--sp - 1] = r;
  }
  return st[0];
}

}  // namespace aotc::expr
