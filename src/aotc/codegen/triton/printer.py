"""Triton spellings: index expressions, dtypes, constants, casts and loop-IR ops.

The Triton twin of `codegen/cpp/printer.py`. Values of fp16/bf16 are held in fp32 while
computing (as in the C++ backend); math that `triton.language` lacks is spelled with
`libdevice` (on a GPU, NVIDIA's libdevice; under the interpreter, a NumPy stand-in that
`aotc.runtime.interpret` binds) or with the small helpers of `prelude.py`. Kernels call only
Triton builtins and those helpers, never `@triton.jit` functions of Triton's own library
(`tl.sum`, `tl.sigmoid`): those are interpretable only if Triton was imported in interpreter
mode, and the interpreter path must not depend on when Triton was first imported.
"""
from __future__ import annotations

import math

import sympy
import torch

from aotc.codegen.ir import FloorDiv, ModIndex, Op, index_bounds, product, simplify_index

HALF = (torch.float16, torch.bfloat16)
TL = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
      torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
      torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
      torch.bool: "tl.int1", torch.float8_e4m3fn: "tl.float8e4nv"}
# Kernel signature types of buffer pointers, as `triton.compile` spells them.
POINTER = {torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16",
           torch.bfloat16: "*bf16", torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16",
           torch.int8: "*i8", torch.uint8: "*u8", torch.bool: "*i1",
           torch.float8_e4m3fn: "*fp8e4nv"}


def value_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value of `dtype` is held in while computing (half types in fp32)."""
    return torch.float32 if dtype in HALF else dtype


def value_type(dtype: torch.dtype) -> str:
    return TL[value_dtype(dtype)]


def texpr(e) -> str:
    """Print an integer index expression as Triton (Python-syntax) integer arithmetic.

    Index expressions are non-negative, so `//` and `%` (which truncate in Triton, as in C) give
    floor division and modulo. Dim-size symbols (positive) are kernel arguments `s_<name>`."""
    if isinstance(e, int):
        e = sympy.Integer(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return f"s_{e.name}" if e.is_positive else e.name
    if isinstance(e, (sympy.Min, sympy.Max)):
        fn = "tl.minimum" if isinstance(e, sympy.Min) else "tl.maximum"
        out = texpr(e.args[0])
        for a in e.args[1:]:
            out = f"{fn}({out}, {texpr(a)})"
        return out
    if isinstance(e, FloorDiv):
        return f"({texpr(e.args[0])} // {_operand(e.args[1])})"
    if isinstance(e, ModIndex):
        return f"({texpr(e.args[0])} % {_operand(e.args[1])})"
    if e.is_Add:
        terms = sorted(e.args, key=sympy.default_sort_key)
        out = texpr(terms[0])
        for t in terms[1:]:
            s = texpr(t)
            out += f" - {s[1:]}" if s.startswith("-") else f" + {s}"
        return f"({out})"
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        body = " * ".join(texpr(a) for a in sympy.Mul.make_args(rest))
        if coeff == 1:
            return body
        if coeff == -1:
            return f"-{body}"
        return f"{texpr(coeff)} * {body}"
    if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) > 0:
        return "(" + " * ".join([texpr(e.args[0])] * int(e.args[1])) + ")"
    if isinstance(e, (sympy.floor, sympy.Mod)):
        a, b = (e.args[0].as_numer_denom() if isinstance(e, sympy.floor) else e.args)
        if not (a.is_nonnegative and b.is_positive):   # Python's floor semantics, not C's
            fn = "aotc_floordiv_int" if isinstance(e, sympy.floor) else "aotc_remainder"
            return f"{fn}({texpr(a)}, {texpr(b)})"
        op = "//" if isinstance(e, sympy.floor) else "%"
        return f"({texpr(a)} {op} {_operand(b)})"
    raise NotImplementedError(f"cannot print index expression {e!r}")


def _operand(e) -> str:
    """`e` printed as the right operand of `//` or `%` (a product needs parentheses there)."""
    return texpr(e) if sympy.sympify(e).is_Atom else f"({texpr(e)})"


def constant(value, dtype: torch.dtype) -> str:
    """A Python literal for a constant (Triton types a float literal fp32, an int literal
    int32 or int64 by magnitude; operands of other dtypes promote it)."""
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return f'float("{"-" if v < 0 else ""}inf")'
        return repr(v)
    return str(int(value))


_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.TRUEDIV: "/", Op.EQ: "==", Op.NE: "!=",
          Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">=", Op.BITWISE_AND: "&",
          Op.BITWISE_OR: "|", Op.BITWISE_XOR: "^", Op.LSHIFT: "<<", Op.RSHIFT: ">>"}
_TL = {Op.EXP: "tl.exp", Op.EXP2: "tl.exp2", Op.LOG: "tl.log", Op.LOG2: "tl.log2",
       Op.SQRT: "tl.sqrt", Op.RSQRT: "tl.rsqrt", Op.SIN: "tl.sin", Op.COS: "tl.cos",
       Op.ERF: "tl.erf"}
_LIBDEVICE = {Op.TANH: "tanh", Op.EXPM1: "expm1", Op.LOG1P: "log1p", Op.LOG10: "log10",
              Op.TAN: "tan", Op.ASIN: "asin", Op.ACOS: "acos", Op.ATAN: "atan", Op.SINH: "sinh",
              Op.COSH: "cosh", Op.ASINH: "asinh", Op.ACOSH: "acosh", Op.ATANH: "atanh",
              Op.ATAN2: "atan2", Op.COPYSIGN: "copysign", Op.HYPOT: "hypot",
              Op.ROUND: "nearbyint", Op.TRUNC: "trunc", Op.POW: "pow"}
# Every libdevice function a kernel may call (the interpreter's stand-in must provide each).
LIBDEVICE_FUNCTIONS = frozenset(_LIBDEVICE.values())
_INT_IDENTITY = frozenset({Op.FLOOR, Op.CEIL, Op.ROUND, Op.TRUNC})


def _unary(op: Op, a: str, fp: bool, dtype: torch.dtype) -> str | None:
    zero, one = constant(0, dtype), constant(1, dtype)
    if op in _INT_IDENTITY and not fp:
        return a
    simple = {
        Op.NEG: f"(-{a})", Op.ABS: f"tl.abs({a})", Op.RECIPROCAL: f"({one} / {a})",
        Op.FLOOR: f"tl.floor({a})", Op.CEIL: f"tl.ceil({a})",
        Op.SIGMOID: f"({one} / ({one} + tl.exp(-{a})))",
        Op.RELU: f"tl.where({a} < {zero}, {zero}, {a})",
        Op.SIGN: f"(({zero} < {a}).to({TL[dtype]}) - ({a} < {zero}).to({TL[dtype]}))",
        Op.LOGICAL_NOT: f"({a} == 0)", Op.ISNAN: f"({a} != {a})",
        Op.ISINF: f"(tl.abs({a}) == float(\"inf\"))" if fp else "False",
        Op.BITWISE_NOT: f"({a} == 0)" if dtype == torch.bool else f"(~{a})",
        Op.SIGNBIT: (f"({a}.to({'tl.int64' if dtype == torch.float64 else 'tl.int32'}, "
                     f"bitcast=True) < 0)") if fp else f"({a} < 0)",
    }
    return simple.get(op)


def _binary(op: Op, a: str, b: str, fp: bool, dtype: torch.dtype) -> str | None:
    if op in _INFIX:
        return f"({a} {_INFIX[op]} {b})"
    table = {
        Op.LOGICAL_AND: f"(({a} != 0) & ({b} != 0))", Op.LOGICAL_OR: f"(({a} != 0) | ({b} != 0))",
        Op.LOGICAL_XOR: f"(({a} != 0) ^ ({b} != 0))",
        Op.MAXIMUM: f"aotc_maximum({a}, {b})" if fp else f"tl.maximum({a}, {b})",
        Op.MINIMUM: f"aotc_minimum({a}, {b})" if fp else f"tl.minimum({a}, {b})",
        Op.FMOD: f"({a} % {b})",   # Triton's % is C's fmod / remainder (sign of the dividend)
        Op.REMAINDER: f"aotc_remainder({a}, {b})",
        Op.FLOORDIV: f"aotc_floordiv_fp({a}, {b})" if fp else f"aotc_floordiv_int({a}, {b})",
    }
    if op == Op.POW and not fp:
        return f"aotc_ipow({a}, {b})"
    return table.get(op)


def op_expr(op: Op, args: list[str], dtypes: list[torch.dtype], dtype: torch.dtype) -> str:
    """Triton expression for `op` on operands `args`, all held in value dtype `dtype`."""
    a = args[0]
    fp = dtypes[0].is_floating_point
    if op == Op.WHERE:
        return f"tl.where({a}, {args[1]}, {args[2]})"
    if fp and op in _TL:
        return f"{_TL[op]}({a})"
    if fp and op in _LIBDEVICE:
        return f"libdevice.{_LIBDEVICE[op]}({', '.join(args)})"
    if len(args) == 1:
        text = _unary(op, a, fp, dtype)
    else:
        text = _binary(op, a, args[1], fp, dtype)
    if text is None:
        raise NotImplementedError(f"no Triton spelling for {op} on {dtypes[0]}")
    return text


def fold_index(expr, ranges: dict):
    """`simplify_index`, with the variables of size-1 dims replaced by 0: they are scalars, so
    an index never claims to vary over a block axis it does not."""
    expr = sympy.expand(sympy.sympify(expr).subs({v: 0 for v, n in ranges.items() if n == 1}))
    return simplify_index(expr, ranges)


def extent(buf) -> sympy.Expr:
    """Elements from a buffer's first to one past its last (strides are non-negative)."""
    return 1 + sum(((d - 1) * s for d, s in zip(buf.shape, buf.stride)), sympy.Integer(0))


def in_bounds(index, buf, ranges: dict) -> bool:
    """Whether `index` provably addresses `buf` for every value of the loop variables: it and
    every numerator it divides are bounded, non-negative, and it stays below the extent."""
    def nonneg(e):
        return sympy.simplify(e).is_nonnegative is True

    def bounds(e):
        try:
            return index_bounds(e, ranges)
        except sympy.PolynomialError:   # a variable inside a division: not analysed
            return None
    for sub in sympy.preorder_traversal(index):
        if isinstance(sub, (FloorDiv, ModIndex)):
            b = bounds(sub.args[0])
            if b is None or not nonneg(b[0]):
                return False
    b = bounds(index)
    return b is not None and nonneg(b[0]) and nonneg(extent(buf) - 1 - b[1])


def cast(expr: str, axes, tl_type: str) -> str:
    """`expr` converted to `tl_type` (a scalar expression may be a Python number)."""
    return f"{expr}.to({tl_type})" if axes else f"tl.cast({expr}, {tl_type})"


def to_half(expr: str, axes, src: torch.dtype, dtype: torch.dtype) -> str:
    """`expr` rounded to fp16/bf16 (to nearest even) and held in fp32; integers and fp64 go
    through fp32. Two conversions, one instruction each on a GPU (an emulated rounding in
    integer ops made bf16 GELU compute-bound: 81 against 32 us over GPT-2's [8192, 3072] on an
    H200); aotc's interpreter launches round them as a GPU does (runtime/interpret.py)."""
    if value_dtype(src) != torch.float32:
        expr = cast(expr, axes, "tl.float32")
    return f"{cast(expr, axes, TL[dtype])}.to(tl.float32)"


def convert(value, dtype):
    """A constant converted to `dtype` at codegen time (as torch would convert it)."""
    if dtype == torch.bool:
        return bool(value)
    return torch.tensor(value).to(dtype).item()


def reduce_sum(block: str) -> str:
    return f"tl.reduce({block}, 1, aotc_add, keep_dims=True)"


def unravel(flat: str, names: list, sizes) -> list[str]:
    """Lines that split a flat block index into per-dim index variables (row-major)."""
    lines = []
    for i, (name, n) in enumerate(zip(names, sizes)):
        stride = product(sizes[i + 1:])
        if n == 1:
            lines.append(f"{name} = 0")
            continue
        e = sympy.Symbol(flat, integer=True, nonnegative=True)
        e = FloorDiv(e, stride) if stride != 1 else e
        e = ModIndex(e, n) if i > 0 else e
        lines.append(f"{name} = {texpr(e)}")
    return lines


def stored_value(value, dtype) -> str:
    """A kernel value (a TVal) as a store into a buffer of `dtype` converts it (halves rounded
    once)."""
    v = value.expr
    if value.const is None and dtype in HALF and value.dtype != dtype:
        v = cast(to_half(v, value.axes, value.dtype, dtype), value.axes, TL[dtype])
    elif value.const is None and value_dtype(value.dtype) != dtype:
        v = cast(v, value.axes, TL[dtype])
    return v
