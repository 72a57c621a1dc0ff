"""The loop-level IR, shared by every backend.

Define-by-run, as in TorchInductor: a node's body is a plain Python function `inner_fn(h, index)`
that computes one element by calling an ops handler `h` (load, constant, index_expr, to_dtype and
`h.op(Op.X, ...)`). Running the body with a C++ handler emits C++; with a counting handler it
measures cost; with a recording handler it lists reads. Sizes and indices are sympy expressions
from day one: a static size is an integer expression, so dynamic shapes need no redesign.

    Pointwise(ranges, inner_fn)                       out[index] = inner_fn(index)
    Reduction(ranges, reduction_ranges, type, fn)     out[index] = reduce_r fn(index, r)
    Buffer(name, shape, stride, dtype)                realized storage (plan slot)
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from dataclasses import dataclass
from enum import Enum
from typing import Callable

import sympy
import torch


# ------------------------------------------------------------------------------ index algebra

class FloorDiv(sympy.Function):
    """Integer floor division of non-negative index expressions."""
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):   # (a // b) // c == a // (b * c)
            return FloorDiv(a.args[0], a.args[1] * b)
        return None


class ModIndex(sympy.Function):
    """a % b for non-negative index expressions."""
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        return None


def size_symbol(name: str) -> sympy.Symbol:
    """The symbol of a dynamic dim: a positive integer (loop/index vars are only non-negative,
    which is how printers tell them apart)."""
    return sympy.Symbol(name, integer=True, positive=True)


def sym(n) -> sympy.Expr:
    """A size as a sympy expression: ints, sympy expressions, or Python-syntax strings over dim
    names ("2*seq", "batch // 2") as Programs and plans carry them."""
    if isinstance(n, int):
        return sympy.Integer(n)
    if isinstance(n, str):
        names = set(re.findall(r"[A-Za-z_]\w*", n)) - {"min", "max"}
        local = {k: size_symbol(k) for k in names}
        local.update(min=sympy.Min, max=sympy.Max)
        return sympy.sympify(n, locals=local)
    return n


def dims(sizes) -> tuple:
    """A plan slot's sizes (ints, or the schema's expression nodes) as sympy expressions."""
    return tuple(_node_sym(d) for d in sizes)


@functools.lru_cache(maxsize=16384)
def _node_sym(d) -> sympy.Expr:
    from aotc.artifact.schema.expr import text
    return sym(d if isinstance(d, int) else text(d))


def size_texts(xs) -> list:
    """Sizes as plans carry them, what `sym` reads back: ints, or Python-syntax expressions over
    the dim names (sympy's own printing would say `floor(seq/2)`)."""
    from aotc.exporter.symbols import SymbolNamer
    name = SymbolNamer().expr
    return [int(x) if (isinstance(x, int) or getattr(x, "is_Integer", False)) else name(x)
            for x in xs]


def index_vars(prefix: str, n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(n))


def product(xs) -> sympy.Expr:
    out = sympy.Integer(1)
    for x in xs:
        out = out * x
    return out


def contiguous_strides(shape) -> tuple[sympy.Expr, ...]:
    strides, acc = [], sympy.Integer(1)
    for d in reversed(shape):
        strides.append(acc)
        acc = acc * d
    return tuple(reversed(strides))


def linear_index(index, strides) -> sympy.Expr:
    return sympy.Add(*[i * s for i, s in zip(index, strides)]) if index else sympy.Integer(0)


def unravel(flat: sympy.Expr, shape) -> list[sympy.Expr]:
    """Multi-index of a flat (row-major) position in `shape`."""
    out, stride = [], product(shape)
    for d in shape:
        stride = sympy.cancel(stride / d) if d != 0 else stride
        out.append(ModIndex(FloorDiv(flat, stride), d) if d != 1 else sympy.Integer(0))
    return out


# ----------------------------------------------------------------------------- ops vocabulary

class Op(str, Enum):
    NEG = "neg"; ABS = "abs"; EXP = "exp"; EXPM1 = "expm1"; LOG = "log"; LOG1P = "log1p"
    LOG2 = "log2"; SQRT = "sqrt"; RSQRT = "rsqrt"; SIN = "sin"; COS = "cos"; TAN = "tan"
    TANH = "tanh"; SIGMOID = "sigmoid"; ERF = "erf"; FLOOR = "floor"; CEIL = "ceil"
    ROUND = "round"; TRUNC = "trunc"; RECIPROCAL = "reciprocal"; RELU = "relu"; SIGN = "sign"
    LOGICAL_NOT = "logical_not"; BITWISE_NOT = "bitwise_not"; ISNAN = "isnan"; ISINF = "isinf"
    ASIN = "asin"; ACOS = "acos"; ATAN = "atan"; SINH = "sinh"; COSH = "cosh"; ASINH = "asinh"
    ACOSH = "acosh"; ATANH = "atanh"; EXP2 = "exp2"; LOG10 = "log10"; SIGNBIT = "signbit"
    ADD = "add"; SUB = "sub"; MUL = "mul"; TRUEDIV = "truediv"; FLOORDIV = "floordiv"
    REMAINDER = "remainder"; FMOD = "fmod"; POW = "pow"; MAXIMUM = "maximum"; MINIMUM = "minimum"
    EQ = "eq"; NE = "ne"; LT = "lt"; LE = "le"; GT = "gt"; GE = "ge"; ATAN2 = "atan2"
    LOGICAL_AND = "logical_and"; LOGICAL_OR = "logical_or"; LOGICAL_XOR = "logical_xor"
    BITWISE_AND = "bitwise_and"; BITWISE_OR = "bitwise_or"; BITWISE_XOR = "bitwise_xor"
    LSHIFT = "lshift"; RSHIFT = "rshift"; COPYSIGN = "copysign"; HYPOT = "hypot"
    WHERE = "where"


UNARY = frozenset({Op.NEG, Op.ABS, Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.LOG2, Op.SQRT, Op.RSQRT,
                   Op.SIN, Op.COS, Op.TAN, Op.TANH, Op.SIGMOID, Op.ERF, Op.FLOOR, Op.CEIL,
                   Op.ROUND, Op.TRUNC, Op.RECIPROCAL, Op.RELU, Op.SIGN, Op.LOGICAL_NOT,
                   Op.BITWISE_NOT, Op.ISNAN, Op.ISINF, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH,
                   Op.COSH, Op.ASINH, Op.ACOSH, Op.ATANH, Op.EXP2, Op.LOG10, Op.SIGNBIT})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.TRUEDIV, Op.FLOORDIV, Op.REMAINDER, Op.FMOD, Op.POW,
                    Op.MAXIMUM, Op.MINIMUM, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.ATAN2,
                    Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR, Op.BITWISE_AND, Op.BITWISE_OR,
                    Op.BITWISE_XOR, Op.LSHIFT, Op.RSHIFT, Op.COPYSIGN, Op.HYPOT})
TERNARY = frozenset({Op.WHERE})
PREDICATES = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.LOGICAL_AND, Op.LOGICAL_OR,
                        Op.LOGICAL_XOR, Op.LOGICAL_NOT, Op.ISNAN, Op.ISINF, Op.SIGNBIT})
# Ops whose cost justifies realizing a multiply-used value rather than recomputing it.
EXPENSIVE = frozenset({Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.TANH, Op.SIGMOID, Op.ERF, Op.POW,
                       Op.SIN, Op.COS, Op.TAN, Op.ATAN2, Op.SQRT, Op.RSQRT, Op.TRUEDIV})


class ReductionType(str, Enum):
    SUM = "sum"; PROD = "prod"; MAX = "max"; MIN = "min"; ANY = "any"; ALL = "all"
    ARGMAX = "argmax"; ARGMIN = "argmin"
    WELFORD = "welford"     # (mean, m2, count) in one pass: var/var_mean/layer norm


ARG_REDUCTIONS = frozenset({ReductionType.ARGMAX, ReductionType.ARGMIN})


class NullHandler:
    """An ops handler that computes nothing: the base of analysis handlers (cost counting,
    load recording, verification), which override only what they look at."""

    def load(self, name, index):
        return 0

    def constant(self, value, dtype):
        return 0

    def index_expr(self, expr, dtype):
        return 0

    def to_dtype(self, x, dtype):
        return 0

    def op(self, op, *args):
        return 0

    def masked(self, mask, fn, other, dtype):
        return fn()

    def indirect(self, value, size, wraps=True, op="aten::index.Tensor"):
        """A runtime index into a dim of `size`: negatives count from the end where `wraps`
        (aten.index), and are out of range otherwise (embedding, gather, index_select), as in
        eager PyTorch; `op` names the indexing op for error messages."""
        return sympy.Symbol(f"indirect{id(value)}", integer=True)

    def bounded_index(self, expr, size):
        """`expr`, known by the caller to lie in [0, size) where it is used (inside a mask
        that says so): a backend may name it to simplify the indices that use it."""
        return expr


# ---------------------------------------------------------------------------------- IR nodes

InnerFn = Callable  # (handler, index tuple) -> handler value


@dataclass(frozen=True, slots=True, kw_only=True)
class Buffer:
    """Realized storage: a plan slot (input, weight, extern output or kernel output)."""
    name: str
    slot: int
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    constant: bool = False      # a weight or a view of one: no step ever writes it

    def loader(self) -> InnerFn:
        name, stride = self.name, self.stride
        return lambda h, idx: h.load(name, linear_index(idx, stride))


@dataclass(frozen=True, slots=True, kw_only=True)
class Pointwise:
    ranges: tuple
    dtype: torch.dtype
    inner_fn: InnerFn
    origins: tuple[str, ...] = ()        # ATen ops folded into this body, for reports

    def loader(self) -> InnerFn:
        return self.inner_fn


@dataclass(frozen=True, slots=True, kw_only=True)
class Reduction:
    ranges: tuple
    reduction_ranges: tuple
    reduction_type: ReductionType
    dtype: torch.dtype                   # accumulation / output dtype
    inner_fn: InnerFn                    # (h, index, rindex) -> value (welford: value)
    output_index: int = 0                # welford: 0 mean, 1 m2 (var*count); arg*: index
    origins: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputedBuffer:
    """A Pointwise or Reduction realized into buffers (two for welford): one schedulable node."""
    buffers: tuple[Buffer, ...]
    body: Pointwise | Reduction

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.body, Reduction)


def replace(node, **changes):
    return dataclasses.replace(node, **changes)


def index_bounds(expr, ranges: dict) -> tuple | None:
    """(min, max) of a non-negative index expression over loop-var ranges (var -> size), as
    expressions in the dim sizes; None if a term's sign or range is unknown."""
    lo = hi = sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        loops = [v for v in term.free_symbols if v in ranges]
        mods = [f for f in sympy.Mul.make_args(term) if isinstance(f, ModIndex)]
        floors = [f for f in sympy.Mul.make_args(term) if isinstance(f, FloorDiv)]
        if len(floors) + len(mods) == 1 and (floors or mods)[0].args[1].is_positive:
            f = (floors or mods)[0]
            factor = sympy.cancel(term / f)
            if not factor.is_nonnegative or factor.free_symbols & set(ranges):
                return None
            inner = index_bounds(f.args[0], ranges)
            if inner is None and floors:
                return None
            if floors:
                lo, hi = lo + factor * FloorDiv(inner[0], f.args[1]), \
                    hi + factor * FloorDiv(inner[1], f.args[1])
            elif inner is not None and (f.args[1] - 1 - inner[1]).is_nonnegative:
                lo, hi = lo + factor * inner[0], hi + factor * inner[1]   # never wraps
            else:
                hi = hi + factor * (f.args[1] - 1)
            continue
        if not loops and not mods:
            if not term.is_nonnegative:
                return None
            lo, hi = lo + term, hi + term
        elif len(loops) == 1 and not mods and sympy.degree(term, loops[0]) == 1:
            factor = sympy.cancel(term / loops[0])
            if not factor.is_nonnegative:
                return None
            hi = hi + factor * (ranges[loops[0]] - 1)
        elif len(mods) == 1 and not (term.free_symbols & set(ranges)) - mods[0].free_symbols:
            factor = sympy.cancel(term / mods[0])
            if not factor.is_nonnegative or factor.free_symbols & set(ranges):
                return None
            hi = hi + factor * (mods[0].args[1] - 1)
        else:
            return None
    return lo, hi


_MINIMA: contextvars.ContextVar[dict] = contextvars.ContextVar("aotc_size_minima", default={})


@contextlib.contextmanager
def declared_minima(symbols: dict | None):
    """Inside this block, proofs about sizes use each dim's declared lower bound (a Program's
    `symbols`: name -> {"min", ...}) instead of 1: `x[:, -3:]` along `seq` in 5..16 starts at
    `seq - 3`. Sound because the runtime's guards refuse smaller sizes before a kernel runs
    (with `check_guards=False` the caller vouches for the range)."""
    token = _MINIMA.set({name: max(1, int(r["min"])) for name, r in (symbols or {}).items()})
    try:
        yield
    finally:
        _MINIMA.reset(token)


def provably_nonnegative(expr) -> bool:
    """Whether `expr` >= 0 for every value of its symbols: dim sizes (positive, or at least
    their declared minimum inside `declared_minima`) and loop variables (non-negative). A
    proof, never a guess, so callers may drop a mask or a bounds check on it. Each size s is
    written lo + t with t >= 0: a polynomial whose every coefficient is then non-negative is
    non-negative everywhere (`seq*batch - seq` is `t_s*t_b + t_b`); otherwise sympy's
    assumptions decide, and what they leave open is False."""
    e = sympy.expand(sympy.sympify(expr))
    if e.is_Number:
        return bool(e >= 0)
    minima = _MINIMA.get()
    shift = {s: sympy.Symbol(f"{s.name}_t", integer=True, nonnegative=True) + minima.get(s.name, 1)
             for s in e.free_symbols if s.is_positive and s.is_integer}
    shifted = sympy.expand(e.subs(shift, simultaneous=True))
    if all(_nonnegative_term(t) for t in sympy.Add.make_args(shifted)):
        return True
    return e.is_nonnegative is True


def provable_min(a, b):
    """min(a, b) where one side is provably the smaller for every size, else None."""
    return a if provably_nonnegative(b - a) else b if provably_nonnegative(a - b) else None


def provable_max(a, b):
    """max(a, b) where one side is provably the larger for every size, else None."""
    return a if provably_nonnegative(a - b) else b if provably_nonnegative(b - a) else None


def _nonnegative_term(term) -> bool:
    """A number >= 0 times powers of non-negative symbols."""
    coeff, rest = term.as_coeff_Mul()
    if not coeff.is_Number or coeff < 0:
        return False
    for f in sympy.Mul.make_args(rest):
        base, exp = f.as_base_exp()
        if not (base.is_Symbol and base.is_nonnegative and exp.is_Integer and exp > 0) \
                and f != 1:
            return False
    return True


def _divisible(term, b) -> bool:
    """Whether `term` is a whole multiple of `b` for every value of its symbols. An integer
    `b` divides a term exactly when it divides its numeric coefficient (the rest is a product
    of symbols that may take any value); symbolic divisors need sympy's cancel."""
    if b.is_Integer:
        c, _ = term.as_coeff_Mul()
        return bool(c.is_Integer and int(c) % int(b) == 0)
    return sympy.fraction(sympy.cancel(term / b))[1] == 1


def _nonnegative_number(e) -> bool:
    e = e if e.is_Number else sympy.simplify(e)
    return e.is_nonnegative is True


def simplify_index(expr, ranges: dict):
    """Fold FloorDiv/ModIndex using the ranges of the loop variables (var -> size).
    Pure in its arguments, so results are cached: kernels index the same views many times."""
    return _simplify_index(sympy.expand(expr), tuple(sorted(ranges.items(), key=str)))


@functools.lru_cache(maxsize=65536)
def _simplify_index(expr, ranges_items: tuple):
    ranges = dict(ranges_items)
    bounds_memo: dict = {}

    def bounds(e):
        if e not in bounds_memo:
            bounds_memo[e] = index_bounds(e, ranges)
        return bounds_memo[e]

    def nonnegative(e) -> bool:   # so C's truncating / and % agree with floor semantics
        b = bounds(e)
        return b is not None and _nonnegative_number(b[0])

    def within(e, k) -> bool:   # 0 <= e < k for every value of the loop variables
        b = bounds(e)
        return b is not None and _nonnegative_number(b[0]) and _nonnegative_number(k - 1 - b[1])

    memo: dict = {}   # index expressions of stacked views share subtrees: fold each once

    def fold(e):
        if not e.args:
            return e
        if e not in memo:
            memo[e] = fold_node(e.func(*[fold(a) for a in e.args]))
        return memo[e]

    def fold_node(e):
        if isinstance(e, sympy.Add):
            return _recombine(e)
        if not isinstance(e, (FloorDiv, ModIndex)):
            return e
        a, b = e.args
        terms = sympy.Add.make_args(sympy.expand(a))
        keep = [t for t in terms if _divisible(t, b)]
        rest = sympy.Add(*[t for t in terms if not _divisible(t, b)])
        if within(rest, b):
            return sympy.expand(sympy.Add(*keep) / b) if isinstance(e, FloorDiv) else rest
        if keep and nonnegative(rest):   # whole multiples of b leave the division
            if isinstance(e, FloorDiv):
                return sympy.expand(sympy.Add(*keep) / b) + fold(FloorDiv(rest, b))
            return fold(ModIndex(rest, b))
        return _split_common_factor(e, terms, b, fold, within)
    return fold(expr)


def _split_common_factor(e, terms, b, fold, within):
    """(k*x + y) // (k*m) == x // m and (k*x + y) % (k*m) == k*(x % m) + y, for 0 <= y < k:
    a flattened row index divided back into its dims ((p0 + 512*r0) // 32768 -> r0 // 64)."""
    if not b.is_Integer:
        return e
    for k in sorted({int(sympy.gcd(_coefficient(t), b)) for t in terms}, reverse=True):
        if k <= 1 or k == b:
            continue
        big = [t for t in terms if _divisible(t, sympy.Integer(k))]
        small = sympy.Add(*[t for t in terms if not _divisible(t, sympy.Integer(k))])
        if big and within(small, k):
            x = sympy.expand(sympy.Add(*big) / k)
            if isinstance(e, FloorDiv):
                return fold(FloorDiv(x, b // k))
            return sympy.expand(k * fold(ModIndex(x, b // k)) + small)
    return e


def _coefficient(term) -> sympy.Integer:
    c, _ = term.as_coeff_Mul()
    return sympy.Integer(c) if c.is_Integer else sympy.Integer(1)


def _recombine(e: sympy.Expr) -> sympy.Expr:
    """c*(x % m) + c*m*(x // m) -> c*x: a dim split by a view and joined again."""
    terms = list(sympy.Add.make_args(e))
    for t in terms:
        c, f = t.as_coeff_Mul()
        if not isinstance(f, ModIndex):
            continue
        x, m = f.args
        partner = c * m * FloorDiv(x, m)
        if any(sympy.expand(u - partner) == 0 for u in terms):
            rest = [u for u in terms if u is not t and sympy.expand(u - partner) != 0]
            return _recombine(sympy.Add(*rest, c * x))
    return e
