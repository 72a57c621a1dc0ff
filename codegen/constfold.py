"""Proving a lazy tensor constant: an abstract evaluation of its body over its index ranges.

Model code often builds tensors whose every element is known at export: transformers, when
traced, materialize an attention mask such as `arange(n) >= 0` (all True) that eager execution
would have skipped as a no-op. `constant_value(tv)` evaluates such a body with `FoldHandler`,
whose values are Python constants, index expressions (sympy, over loop variables with known
ranges) or UNKNOWN, and decides comparisons from the bounds of index expressions. It answers a
value only when it is a proof for every element; anything it cannot follow (loads, masked
regions, floating arithmetic) is UNKNOWN.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import sympy
import torch

from aotc.codegen.ir import NullHandler, Op, index_bounds, index_vars

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
        return UNKNOWN

    def indirect(self, value, size):
        """An index read from a tensor: its index expression where the analysis knows it
        (a gather from `arange`), else a fresh unknown symbol."""
        if isinstance(value, tuple):
            return value[1]
        if type(value) is int:
            return sympy.Integer(value)
        return sympy.Symbol(f"indirect{id(value)}", integer=True)

    def op(self, op, *args):
        if any(a is UNKNOWN for a in args):
            return UNKNOWN
        symbolic = any(isinstance(a, tuple) for a in args)
        integral = all(isinstance(a, tuple) or type(a) is int for a in args)
        if op in _ARITH and symbolic and integral:
            e = sympy.expand(_ARITH[op](*(_expr(a) for a in args)))
            return int(e) if e.is_Integer else ("index", e)
        if op in _COMPARE and integral:
            return self._compare(op, *args)
        if symbolic:
            return UNKNOWN
        if op == Op.WHERE:
            cond, a, b = args
            if isinstance(cond, bool):
                return a if cond else b
            if a is True and b is False or a == b and type(a) is type(b):
                return cond if a is True else a     # where(p, True, False) is p
            return UNKNOWN
        if all(isinstance(a, (bool, Predicate)) for a in args):
            if op in _LOGIC:
                return _logic(op, *args)
            if op in (Op.LOGICAL_NOT, Op.BITWISE_NOT) and isinstance(args[0], bool):
                return not args[0]
        return UNKNOWN

    def _compare(self, op, a, b):
        bounds = self.bounds(sympy.expand(_expr(a) - _expr(b)))
        if bounds is None:
            return Predicate.of(op, _expr(a), _expr(b))
        lo, hi = bounds
        answers = {Op.GE: (lo >= 0, hi < 0), Op.GT: (lo > 0, hi <= 0),
                   Op.LE: (hi <= 0, lo > 0), Op.LT: (hi < 0, lo >= 0),
                   Op.EQ: (lo == hi == 0, lo > 0 or hi < 0),
                   Op.NE: (lo > 0 or hi < 0, lo == hi == 0)}
        true, false = answers[op]
        if true or false:
            return bool(true)
        return Predicate.of(op, _expr(a), _expr(b))

    def bounds(self, diff) -> tuple[int, int] | None:
        """Integer (min, max) of an index expression over the ranges, or None: the bounds of
        its positive terms less those of its negated negative terms."""
        terms = sympy.Add.make_args(sympy.expand(diff))
        const = sum((t for t in terms if t.is_Number), sympy.Integer(0))
        pos = sum((t for t in terms if not t.is_Number and t.as_coeff_Mul()[0] > 0),
                  sympy.Integer(0))
        neg = sum((-t for t in terms if not t.is_Number and t.as_coeff_Mul()[0] < 0),
                  sympy.Integer(0))
        a, b = index_bounds(pos, self.ranges), index_bounds(neg, self.ranges)
        if a is None or b is None or not all(sympy.sympify(x).is_Integer for x in (*a, *b)):
            return None
        return int(a[0]) - int(b[1]) + int(const), int(a[1]) - int(b[0]) + int(const)


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


def _expr(v):
    return v[1] if isinstance(v, tuple) else sympy.Integer(int(v))


def split_index(index, shape, stride, ranges: dict) -> tuple | None:
    """The multi-index (one loop variable or 0 per dim) whose linear index over `stride` is
    `index`, or None where `index` is not such a plain combination."""
    e = sympy.expand(sympy.sympify(index))
    e = e.subs({v: 0 for v in e.free_symbols if ranges.get(v) == 1})
    out = [sympy.Integer(0)] * len(shape)
    for term in sympy.Add.make_args(e):
        if term == 0:
            continue
        coeff, var = term.as_coeff_Mul()
        if var not in ranges:
            return None
        dims = [k for k, (n, s) in enumerate(zip(shape, stride))
                if sympy.sympify(n) != 1 and sympy.sympify(s - coeff) == 0 and out[k] == 0]
        if len(dims) != 1 or not sympy.sympify(shape[dims[0]] - ranges[var]).is_nonnegative:
            return None
        out[dims[0]] = var
    return tuple(out)


def element_value(tv, bodies: dict | None = None):
    """What every element of lazy tensor `tv` provably is: a constant, a Predicate of its
    index variables (`index_vars("c", rank)`), or UNKNOWN. Sizes must be static (a dynamic
    dim's range is not a proof here)."""
    if not all(sympy.sympify(d).is_Integer for d in tv.shape):
        return UNKNOWN
    idx = index_vars("c", len(tv.shape))
    ranges = {v: int(d) for v, d in zip(idx, tv.shape)}
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
