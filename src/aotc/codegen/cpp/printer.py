"""C++ spellings: index expressions, dtypes, constants and loop-IR ops."""
from __future__ import annotations

import math

import sympy
import torch

from aotc.codegen.ir import FloorDiv, ModIndex, Op

STORAGE = {torch.float32: "float", torch.float64: "double", torch.float16: "_Float16",
           torch.bfloat16: "uint16_t", torch.int64: "int64_t", torch.int32: "int32_t",
           torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t",
           torch.bool: "bool"}
HALF = (torch.float16, torch.bfloat16)


def value_type(dtype: torch.dtype) -> str:
    """C type a value of `dtype` is held in while computing (half types are held in float)."""
    return "float" if dtype in HALF else STORAGE[dtype]


def cexpr(e) -> str:
    """Print an integer index expression as C++ int64 arithmetic."""
    if isinstance(e, int):
        e = sympy.Integer(e)
    if e.is_Integer:
        n = int(e)
        return f"{n}L" if abs(n) >= 2**31 else str(n)
    if e.is_Symbol:
        return f"s_{e.name}" if e.is_positive else e.name   # dim sizes are kernel arguments
    if isinstance(e, (sympy.Min, sympy.Max)):
        fn = "std::min" if isinstance(e, sympy.Min) else "std::max"
        out = cexpr(e.args[0])
        for a in e.args[1:]:
            out = f"{fn}<int64_t>({out}, {cexpr(a)})"
        return out
    if isinstance(e, FloorDiv):
        return f"({cexpr(e.args[0])} / ({cexpr(e.args[1])}))"
    if isinstance(e, ModIndex):
        return f"({cexpr(e.args[0])} % ({cexpr(e.args[1])}))"
    if e.is_Add:
        terms = sorted(e.args, key=sympy.default_sort_key)
        out = cexpr(terms[0])
        for t in terms[1:]:
            s = cexpr(t)
            out += f" - {s[1:]}" if s.startswith("-") else f" + {s}"
        return f"({out})"
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        body = " * ".join(cexpr(a) for a in sympy.Mul.make_args(rest))
        if coeff == 1:
            return body
        if coeff == -1:
            return f"-{body}"
        return f"{cexpr(coeff)} * {body}"
    if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) > 0:
        return "(" + " * ".join([cexpr(e.args[0])] * int(e.args[1])) + ")"
    if isinstance(e, sympy.floor) or isinstance(e, sympy.Mod):
        a, b = (e.args[0].as_numer_denom() if isinstance(e, sympy.floor) else e.args)
        if not (a.is_nonnegative and b.is_positive):   # Python's floor semantics, not C's
            fn = "aotc_floordiv" if isinstance(e, sympy.floor) else "aotc_remainder"
            return f"{fn}<int64_t>({cexpr(a)}, {cexpr(b)})"
        op = "/" if isinstance(e, sympy.floor) else "%"
        return f"({cexpr(a)} {op} ({cexpr(b)}))"
    raise NotImplementedError(f"cannot print index expression {e!r}")


def constant(value, dtype: torch.dtype) -> str:
    ct = value_type(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return f"std::numeric_limits<{ct}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}std::numeric_limits<{ct}>::infinity()"
        text = repr(v)
        return f"{text}f" if ct == "float" else text
    v = int(value)
    return f"(({ct}){v}{'L' if abs(v) >= 2**31 else ''})"


_CALL = {Op.EXP: "std::exp", Op.EXPM1: "std::expm1", Op.LOG: "std::log", Op.LOG1P: "std::log1p",
         Op.LOG2: "std::log2", Op.LOG10: "std::log10", Op.SQRT: "std::sqrt",
         Op.SIN: "std::sin", Op.COS: "std::cos", Op.TAN: "std::tan", Op.TANH: "std::tanh",
         Op.ERF: "std::erf", Op.ASIN: "std::asin", Op.ACOS: "std::acos", Op.ATAN: "std::atan",
         Op.SINH: "std::sinh", Op.COSH: "std::cosh", Op.ASINH: "std::asinh",
         Op.ACOSH: "std::acosh", Op.ATANH: "std::atanh", Op.EXP2: "std::exp2",
         Op.SIGMOID: "aotc_sigmoid", Op.RELU: "aotc_relu", Op.SIGN: "aotc_sign",
         Op.ISNAN: "std::isnan", Op.ISINF: "std::isinf",
         Op.ATAN2: "std::atan2", Op.COPYSIGN: "std::copysign", Op.HYPOT: "std::hypot",
         Op.REMAINDER: "aotc_remainder", Op.FLOORDIV: "aotc_floordiv"}
_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.TRUEDIV: "/", Op.EQ: "==", Op.NE: "!=",
          Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">=", Op.BITWISE_AND: "&",
          Op.BITWISE_OR: "|", Op.BITWISE_XOR: "^", Op.LSHIFT: "<<", Op.RSHIFT: ">>"}
# logical and/or of values already computed: bitwise on bools, since a short-circuit `&&` or
# `||` is control flow that stops GCC's if-conversion (the loop would not vectorize)
_LOGICAL = {Op.LOGICAL_AND: "&", Op.LOGICAL_OR: "|"}


# float versions that vectorize (codegen/cpp/vecmath.h); double keeps libm's
_VECTOR_FLOAT = {Op.EXP: "aotc_expf", Op.TANH: "aotc_tanhf", Op.ERF: "aotc_erff",
                 Op.SIGMOID: "aotc_sigmoidf"}


def op_expr(op: Op, args: list[str], dtypes: list[torch.dtype], ct: str) -> str:
    """C++ expression for `op` on C operands `args` (all held in C type `ct`)."""
    a = args[0]
    if ct == "float" and op in _VECTOR_FLOAT:
        return f"{_VECTOR_FLOAT[op]}({a})"
    fp = dtypes[0].is_floating_point
    if op in _INFIX:
        return f"({a} {_INFIX[op]} {args[1]})"
    if op in _LOGICAL:
        return f"(static_cast<bool>({a}) {_LOGICAL[op]} static_cast<bool>({args[1]}))"
    if not fp and op in (Op.ISNAN, Op.ISINF):
        return "false"
    if op in _CALL:
        return f"{_CALL[op]}({', '.join(args)})"
    simple = {
        Op.NEG: f"(-{a})", Op.ABS: f"std::abs({a})" if fp else f"({a} < 0 ? -{a} : {a})",
        Op.RSQRT: f"({ct}(1) / std::sqrt({a}))", Op.RECIPROCAL: f"({ct}(1) / {a})",
        Op.FLOOR: f"std::floor({a})" if fp else a, Op.CEIL: f"std::ceil({a})" if fp else a,
        Op.ROUND: f"std::nearbyint({a})" if fp else a, Op.TRUNC: f"std::trunc({a})" if fp else a,
        Op.LOGICAL_NOT: f"(!{a})", Op.BITWISE_NOT: f"(!{a})" if ct == "bool" else f"(~{a})",
        # not std::signbit: g++ 12 -O3 -march=x86-64-v4 crashes (ICE in extract_insn)
        # vectorizing it on a float widened from bf16; copysign keeps -0.0 and -NaN's sign
        Op.SIGNBIT: f"(std::copysign({ct}(1), {a}) < {ct}(0))" if fp else f"({a} < 0)",
    }
    if op in simple:
        return simple[op]
    b = args[1] if len(args) > 1 else None
    if op == Op.MAXIMUM:
        return f"aotc_maximum<{ct}>({a}, {b})"
    if op == Op.MINIMUM:
        return f"aotc_minimum<{ct}>({a}, {b})"
    if op == Op.LOGICAL_XOR:
        return f"((bool){a} != (bool){b})"
    if op == Op.FMOD:
        return f"std::fmod({a}, {b})" if fp else f"({a} % {b})"
    if op == Op.POW:
        return f"std::pow({a}, {b})" if fp else f"aotc_ipow<{ct}>({a}, {b})"
    if op == Op.WHERE:
        return f"({a} ? {args[1]} : {args[2]})"
    raise NotImplementedError(f"no C++ spelling for {op}")
