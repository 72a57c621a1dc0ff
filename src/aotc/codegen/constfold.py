"""Proving a lazy tensor constant: an abstract evaluation of its body over its index ranges.

Model code often builds tensors whose every element is known at export: transformers, when
traced, materialize an attention mask such as `arange(n) >= 0` (all True) that eager execution
would have skipped as a no-op. `constant_value(tv)` evaluates such a body with `FoldHandler`,
whose values are Python constants, index expressions (sympy, over loop variables with known
ranges) or UNKNOWN, and decides comparisons from the bounds of index expressions. It answers a
value only when it is a proof for every element; anything it cannot follow (loads, masked
regions, floating arithmetic) is UNKNOWN. A dynamic dim's range is [0, n - 1] with n a size
symbol: bounds are then expressions in the sizes, and a comparison is decided only where its
answer holds for every size (`ir.provably_nonnegative`), so one artifact's proof serves all.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import sympy
import torch

from aotc.codegen.ir import (NullHandler, Op, index_bounds, index_vars, provable_max, provable_min,
                             provably_nonnegative as nonneg)

UNKNOWN = object()

_COMPARE = {Op.GE: operator.ge, Op.GT: operator.gt, Op.LE: operator.le, Op.LT: operator.lt,
            Op.EQ: operator.eq, Op.NE: operator.ne}
_ARITH = {Op.ADD: operator.add, Op.SUB: operator.sub, Op.MUL: operator.mul}
_LOGIC = {Op.LOGICAL_AND: lambda a, b: a and b, Op.LOGICAL_OR: lambda a, b: a or b,
          Op.BITWISE_AND: lambda a, b: a and b, Op.BITWISE_OR: lambda a, b: a or b}


class FoldHandler(NullHandler):
    """Ops handler over Python constants, ("index", sympy expr) pairs and UNKNOWN."""

    def __init__(self, ranges: dict, bodies: dict | None = None):
        self.ranges, self.bodies = ranges, bodies or {}

    def load(self, name, index):
        """A load from a buffer that a pointwise body computed is that body at the element
        read, when the read's index names one loop variable per dim (views: broadcasts,
        permutes, expands); any other load is UNKNOWN."""
        if name not in self.bodies:
            return UNKNOWN
        buf, loader = self.bodies[name]
        idx = split_index(index, buf.shape, buf.stride, self.ranges)
        return UNKNOWN if idx is None else loader(self, idx)

    def constant(self, value, dtype):
        return value

    def index_expr(self, expr, dtype):
        expr = sympy.sympify(expr)
        return int(expr) if expr.is_Integer else ("index", expr)

    def to_dtype(self, x, dtype):
        if x is UNKNOWN:
            return UNKNOWN
        if isinstance(x, Predicate):
            return x if dtype == torch.bool else UNKNOWN
        if isinstance(x, tuple):   # an index expression: exact in integer dtypes only
            return x if not (dtype.is_floating_point or dtype == torch.bool) else UNKNOWN
        if dtype == torch.bool:
            return bool(x)
        return float(x) if dtype.is_floating_point else int(x)

    def masked(self, mask, fn, other, dtype):
        if mask is UNKNOWN:
            return UNKNOWN
        if isinstance(mask, bool):
            return fn() if mask else other
        return self._select(mask, fn(), other)

    def indirect(self, value, size, wraps=True, op="aten::index.Tensor"):
        """An index read from a tensor: its index expression where the analysis knows it
        (a gather from `arange`), else a fresh unknown symbol."""
        if isinstance(value, tuple):
            return value[1]
        if type(value) is int:
            return sympy.Integer(value)
        return sympy.Symbol(f"indirect{id(value)}", integer=True)

    def op(self, op, *args):
        if op == Op.WHERE:
            return self._select(*args)
        if any(a is UNKNOWN or isinstance(a, Select) for a in args):
            return UNKNOWN
        symbolic = any(isinstance(a, tuple) for a in args)
        integral = all(_integral(a) for a in args)
        if op in _ARITH and symbolic and integral:
            e = sympy.expand(_ARITH[op](*(_expr(a) for a in args)))
            return int(e) if e.is_Integer else ("index", e)
        if op in _COMPARE and integral:
            return self._compare(op, *args)
        if symbolic:
            return UNKNOWN
        if all(isinstance(a, (bool, Predicate)) for a in args):
            if op in _LOGIC:
                return _logic(op, *args)
            if op in (Op.LOGICAL_NOT, Op.BITWISE_NOT) and isinstance(args[0], bool):
                return not args[0]
        return UNKNOWN

    def _select(self, cond, a, b):
        """where(cond, a, b). With an element-dependent condition: `a` or `b` when the two are
        equal wherever the condition holds (or wherever it fails), decided over the range of
        its one variable; otherwise a Select that an enclosing select may still resolve. (`cat`
        of `x[:1] - 1` and `x = arange(n)` is `arange(n) - 1` at every position, though it reads
        another part below 1: two nested selects with complementary conditions.)"""
        if UNKNOWN in (a, b) or cond is UNKNOWN:
            return UNKNOWN
        if isinstance(cond, bool):
            return a if cond else b
        if not isinstance(cond, Predicate):
            return UNKNOWN
        if isinstance(a, Select) and _implies(cond, a.cond, holds=True):
            a = a.a
        if isinstance(b, Select) and _implies(cond, b.cond, holds=False):
            b = b.a
        if _same(a, b):
            return a
        if a is True and b is False:
            return cond
        if len(cond.terms) == 1 and _integral(a) and _integral(b):
            (d,), diff = cond.terms, sympy.expand(_expr(a) - _expr(b))
            if self._zero_where(d, diff, holds=True):
                return b
            if self._zero_where(d, diff, holds=False):
                return a
        return Select(cond, a, b)

    def _zero_where(self, d, e, holds: bool) -> bool:
        """Whether `e` is 0 wherever `d <= 0` holds (holds=True) or fails, when `d` is one
        loop variable with coefficient +-1 plus a term free of loop variables. The variable's
        range is cut to where the condition holds (or fails), each end decided for every size
        (an end neither side of which is provable proves nothing)."""
        loops = [v for v in d.free_symbols if v in self.ranges]
        if len(loops) != 1:
            return False
        v = loops[0]
        c1, c0 = d.coeff(v), d.subs(v, 0)
        if c1 not in (1, -1):
            return False
        lo, hi = sympy.Integer(0), self.ranges[v] - 1
        if holds:
            lo, hi = (lo, provable_min(hi, -c0)) if c1 == 1 else (provable_max(lo, c0), hi)
        else:
            lo, hi = (provable_max(lo, 1 - c0), hi) if c1 == 1 else (lo, provable_min(hi, c0 - 1))
        if lo is None or hi is None:
            return False
        if nonneg(lo - hi - 1):
            return True          # the condition never (or always) holds
        w = sympy.Symbol(f"{v}_within", integer=True, nonnegative=True)
        sub = FoldHandler({**self.ranges, w: hi - lo + 1}, self.bodies)
        return sub.bounds(sympy.expand(e.subs(v, w + lo))) == (0, 0)

    def _compare(self, op, a, b):
        """A comparison decided for every element (and every size) from the bounds of
        `a - b`, else a Predicate of the index variables."""
        bounds = self.bounds(sympy.expand(_expr(a) - _expr(b)))
        if bounds is None:
            return Predicate.of(op, _expr(a), _expr(b))
        lo, hi = bounds
        answers = {Op.GE: (lambda: nonneg(lo), lambda: nonneg(-hi - 1)),
                   Op.GT: (lambda: nonneg(lo - 1), lambda: nonneg(-hi)),
                   Op.LE: (lambda: nonneg(-hi), lambda: nonneg(lo - 1)),
                   Op.LT: (lambda: nonneg(-hi - 1), lambda: nonneg(lo)),
                   Op.EQ: (lambda: nonneg(lo) and nonneg(-hi),
                           lambda: nonneg(lo - 1) or nonneg(-hi - 1)),
                   Op.NE: (lambda: nonneg(lo - 1) or nonneg(-hi - 1),
                           lambda: nonneg(lo) and nonneg(-hi))}
        true, false = answers[op]
        if true():
            return True
        if false():
            return False
        return Predicate.of(op, _expr(a), _expr(b))

    def bounds(self, diff) -> tuple | None:
        """(min, max) of an index expression over the ranges, as expressions in the sizes
        (integers when the sizes are), or None: the bounds of its positive terms less those
        of its negated negative terms."""
        terms = sympy.Add.make_args(sympy.expand(diff))
        const = sum((t for t in terms if t.is_Number), sympy.Integer(0))
        pos = sum((t for t in terms if not t.is_Number and t.as_coeff_Mul()[0] > 0),
                  sympy.Integer(0))
        neg = sum((-t for t in terms if not t.is_Number and t.as_coeff_Mul()[0] < 0),
                  sympy.Integer(0))
        a, b = index_bounds(pos, self.ranges), index_bounds(neg, self.ranges)
        if a is None or b is None:
            return None
        return sympy.expand(a[0] - b[1] + const), sympy.expand(a[1] - b[0] + const)


@dataclass(frozen=True, slots=True)
class Predicate:
    """An element-dependent boolean: the conjunction of `terms`, each `expr <= 0` over the
    index variables (integers, so `a < b` is kept as `a - b + 1 <= 0`)."""
    terms: frozenset

    @staticmethod
    def of(op, a, b):
        d = {Op.LE: a - b, Op.LT: a - b + 1, Op.GE: b - a, Op.GT: b - a + 1}.get(op)
        return UNKNOWN if d is None else Predicate(frozenset({sympy.expand(d)}))


def _logic(op, a, b):
    """AND of booleans and predicates (OR only of plain booleans, or with a constant)."""
    if isinstance(a, bool) and isinstance(b, bool):
        return _LOGIC[op](a, b)
    conj = op in (Op.LOGICAL_AND, Op.BITWISE_AND)
    for x, y in ((a, b), (b, a)):
        if isinstance(x, bool):
            return (y if x else False) if conj else (True if x else y)
    return Predicate(a.terms | b.terms) if conj else UNKNOWN


@dataclass(frozen=True, slots=True)
class Select:
    """where(cond, a, b) with an element-dependent condition that no proof has resolved: an
    enclosing select whose condition settles `cond` still can; anything else treats it as
    UNKNOWN."""
    cond: Predicate
    a: object
    b: object


def _implies(outer: Predicate, inner, holds: bool) -> bool:
    """Whether `inner` (one term e <= 0) holds wherever `outer` (one term d <= 0) holds
    (holds=True) or wherever it fails (d >= 1)."""
    if not isinstance(inner, Predicate) or len(outer.terms) != 1 or len(inner.terms) != 1:
        return False
    (d,), (e,) = outer.terms, inner.terms
    gap = sympy.expand(e - d) if holds else sympy.expand(e + d - 1)
    return nonneg(-gap)


def _integral(v) -> bool:
    return isinstance(v, tuple) or type(v) is int


def _same(a, b) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return _integral(a) and _integral(b) and sympy.expand(_expr(a) - _expr(b)) == 0
    return type(a) is type(b) and a == b


def _expr(v):
    return v[1] if isinstance(v, tuple) else sympy.Integer(int(v))


def split_index(index, shape, stride, ranges: dict) -> tuple | None:
    """The multi-index whose linear index over `stride` is `index`: each loop variable's term
    names its dim by its coefficient, and the rest (a constant, or an expression in the sizes)
    is spread from the outermost dim in. The split is then checked, for every size: each dim's
    index stays inside the dim, so it names the one element that a non-overlapping buffer
    stores at `index`. None where `index` is not such a combination."""
    e = sympy.expand(sympy.sympify(index))
    e = e.subs({v: 0 for v in e.free_symbols if ranges.get(v) == 1})
    out = [sympy.Integer(0)] * len(shape)
    loops = sorted(e.free_symbols & set(ranges), key=str)
    const = sympy.expand(e - sum(e.coeff(v) * v for v in loops))
    if const.free_symbols & set(ranges):
        return None        # not linear in the loop variables
    for v in loops:
        coeff = e.coeff(v)
        dims = [k for k, (n, s) in enumerate(zip(shape, stride))
                if sympy.sympify(n) != 1 and sympy.expand(s - coeff) == 0 and out[k] == 0]
        if len(dims) != 1:
            return None
        out[dims[0]] = v
    for k in sorted(range(len(shape)), key=lambda k: -at_sample(stride[k])):
        if sympy.sympify(shape[k]) != 1 and at_sample(stride[k]) > 0:
            q, const = _divmod(const, sympy.sympify(stride[k]))
            out[k] += q
    if const != 0:
        return None
    for x, n in zip(out, shape):
        b = index_bounds(x, ranges)
        if b is None or not (nonneg(b[0]) and nonneg(n - 1 - b[1])):
            return None
    return tuple(out)


def _divmod(a, b) -> tuple:
    """(a // b, a % b) of integers; of size expressions, (a / b, 0) where b divides a and
    (0, a) otherwise (the split's bounds check decides whether that was right)."""
    if a.is_Integer and b.is_Integer:
        return tuple(sympy.Integer(x) for x in divmod(int(a), int(b)))
    q = sympy.cancel(a / b)
    return (sympy.expand(q), sympy.Integer(0)) if sympy.fraction(q)[1] == 1 \
        else (sympy.Integer(0), a)


def at_sample(stride) -> int:
    """A stride's value with every size at 64: orders the dims of a buffer with symbolic
    strides (a search order only, never a proof)."""
    e = sympy.sympify(stride)
    return int(e.subs({s: 64 for s in e.free_symbols}))


def element_value(tv, bodies: dict | None = None):
    """What every element of lazy tensor `tv` provably is: a constant, a Predicate of its
    index variables (`index_vars("c", rank)`), or UNKNOWN. A dim of symbolic size n is an
    index range [0, n - 1]: what is decided holds for every size."""
    idx = index_vars("c", len(tv.shape))
    ranges = {v: sympy.sympify(d) for v, d in zip(idx, tv.shape)}
    try:
        return tv.loader(FoldHandler(ranges, bodies), idx)
    except Exception:   # a body this analysis cannot follow proves nothing
        return UNKNOWN


def is_causal_mask(tv, bodies: dict | None = None) -> bool:
    """Whether boolean `tv` (..., L, S) with L == S is the causal mask `j <= i` (what SDPA's
    is_causal computes) at every batch and head index."""
    if len(tv.shape) < 2 or tv.dtype != torch.bool or \
            sympy.sympify(tv.shape[-1] - tv.shape[-2]) != 0:
        return False
    value = element_value(tv, bodies)
    i, j = index_vars("c", len(tv.shape))[-2:]
    return isinstance(value, Predicate) and value.terms == {j - i}


def constant_value(tv, bodies: dict | None = None):
    """The one value every element of lazy tensor `tv` provably has, or UNKNOWN. `bodies`
    (buffer name -> (Buffer, loader)) lets loads from computed buffers be followed."""
    value = element_value(tv, bodies)
    return value if isinstance(value, (bool, int, float)) else UNKNOWN
