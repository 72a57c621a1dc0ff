"""Row statistics in a one-row product's prologue (codegen/lowering/matvec.py, GPUs): the
product's x is a pointwise function of one or more reductions of a vector onto a single value
(RMSNorm's mean of squares, LayerNorm's mean and variance), and each program of the product
computes those reductions itself, from the raw vector, before its dot products.

A decode step at batch 1 normalizes the hidden state twice a layer, and each norm was a kernel
of one program (a reduction over a row of 896 to 4096 elements, then the normalized row
stored) between two matrix-vector kernels: two of a layer's eight launches, for no work worth
the name, in a step bound by launch latency (issue 49: a 24-layer, width-896 decoder at 46% of
its roofline). Here the statistic becomes a reduction over the product's own rows, [1, N],
each row reducing the same K elements again (its body reads no row index), so the scheduler
fuses it with the product's reduction as a reduction the product reads in its row
(codegen/scheduler.py): one kernel, the statistic in registers, the normalized row computed as
the product loads it and never stored. Each program re-reads K elements of the vector (from
L2: a few KiB) and does K more multiply-adds per row it owns, against K weights a row it
streams from memory.

Taken only where that recomputation is cheap: every statistic a reduction of at most
MAX_ELEMENTS elements onto one value with no costly op in its body, and x's body costly
(exp, division, square roots...) only in what depends on the statistics alone (rsqrt(var +
eps), computed once per row, not per element). Anything else keeps the stored vector
(matvec.py's `_vector`).
"""
from __future__ import annotations

import dataclasses

import sympy

from aotc.codegen.ir import (EXPENSIVE, ComputedBuffer, NullHandler, Op, Reduction, index_vars,
                             product, sym)

PER_ROW = "per_row"        # the origin naming a statistic's per-row copy
MAX_ELEMENTS = 16384      # elements a statistic reduces, reduced again by every program
MAX_ELEMENT_OPS = 24      # ops per element of x outside the statistics


class _Redirect:
    """An ops handler passing everything to `h`, except loads of the statistics (buffer name
    -> loader of its per-column copy), which read row `row` of their copies."""

    def __init__(self, h, copies: dict, row):
        self._h, self._copies, self._row = h, copies, row

    def load(self, name, index):
        if name in self._copies:
            return self._copies[name](self._h, self._row)
        return self._h.load(name, index)

    def __getattr__(self, attr):
        return getattr(self._h, attr)


class _ElementCost(NullHandler):
    """Counts a body's ops on values that depend on its element, not on `stats` alone."""

    def __init__(self, stats: set):
        self.stats, self.ops, self.expensive = stats, 0, 0

    def load(self, name, index):
        self.ops += name not in self.stats
        return name not in self.stats

    def index_expr(self, expr, dtype):
        return bool(sympy.sympify(expr).free_symbols) or expr   # an element's index, or a size

    def constant(self, value, dtype):
        return value       # x**2 is a multiply (codegen/triton/kernel.py)

    def to_dtype(self, x, dtype):
        return x

    def op(self, op, *args):
        element = any(a is True for a in args)
        self.ops += element
        square = op is Op.POW and not isinstance(args[1], bool) and args[1] in (2, 3)
        self.expensive += element and op in EXPENSIVE and not square
        return element


def _loads(fn, *index) -> list[str]:
    from aotc.codegen.scheduler import LoadRecorder
    rec = LoadRecorder()
    fn(rec, *index)
    return list(dict.fromkeys(name for name, _ in rec.loads))


def _statistic(node) -> bool:
    """A reduction onto one value, short and cheap enough for every program to do again."""
    body = node.body
    if not isinstance(body, Reduction) or product(body.ranges) != 1:
        return False
    size = product(body.reduction_ranges)
    if not sympy.sympify(size).is_Integer or int(size) > MAX_ELEMENTS:
        return False
    cost = _ElementCost(set())
    body.inner_fn(cost, index_vars("p", len(body.ranges)),
                  index_vars("r", len(body.reduction_ranges)))
    return cost.expensive == 0


def statistics_first(node) -> bool:
    """Whether `node` (a kernel's first) is a statistic copied for a product's rows."""
    return isinstance(node.body, Reduction) and PER_ROW in node.body.origins


def _statistics(g, names: list) -> list:
    """The statistic nodes `names` come from, and those their bodies read, dependencies first."""
    producers = {b.name: s for s in g.out.steps if isinstance(s, ComputedBuffer)
                 for b in s.buffers}
    found: dict = {}

    def visit(names):
        for name in names:
            node = producers.get(name)
            if node is None or id(node) in found or not _statistic(node):
                continue
            found[id(node)] = None
            body = node.body
            visit(_loads(body.inner_fn, index_vars("p", len(body.ranges)),
                         index_vars("r", len(body.reduction_ranges))))
            found[id(node)] = node
    visit(names)
    return [n for n in found.values() if n is not None]


def _copy(g, node, rows: tuple, copies: dict) -> dict:
    """`node` computed once per row of `rows` (each row the same value); -> {name: loader}."""
    body, zeros = node.body, (sympy.Integer(0),) * len(node.body.ranges)
    fn, known = body.inner_fn, dict(copies)

    def inner_fn(h, idx, ridx):
        return fn(_Redirect(h, known, idx), zeros, ridx)
    new = dataclasses.replace(body, ranges=rows, inner_fn=inner_fn,
                              origins=(*body.origins, PER_ROW))
    bufs = tuple(g.buffer(g.new_slot(rows, b.dtype)) for b in node.buffers)
    g.out.steps.append(ComputedBuffer(buffers=bufs, body=new))
    return {old.name: b.loader() for old, b in zip(node.buffers, bufs)}


class _Inline:
    """An ops handler passing everything to `h`, except loads of realized vectors (buffer name
    -> (rank, its one long dim, its lazy loader)), which compute them from their bodies."""

    def __init__(self, h, vectors: dict):
        self._h, self._vectors = h, vectors

    def load(self, name, index):
        if name not in self._vectors:
            return self._h.load(name, index)
        rank, dim, load = self._vectors[name]
        at = [sympy.Integer(0)] * rank
        at[dim] = index
        return load(self, tuple(at))

    def __getattr__(self, attr):
        return getattr(self._h, attr)


def _vectors(g, names: list) -> dict:
    """{name: (rank, long dim, lazy loader)} of the realized pointwise vectors among `names`
    (contiguous, one dim longer than 1) whose bodies read a statistic: a norm's output that
    several products read is stored before the products are lowered (graph.py: a costly value
    read twice), and each of them computes it again instead."""
    out = {}
    for name in names:
        if name not in g.bodies:
            continue
        buf, load = g.bodies[name]
        long = [d for d, n in enumerate(buf.shape) if n != 1]
        if len(long) != 1 or buf.stride[long[0]] != 1:
            continue
        probe = [sympy.Integer(0)] * len(buf.shape)
        probe[long[0]] = sympy.Symbol("k_probe", integer=True, nonnegative=True)
        if _statistics(g, _loads(load, tuple(probe))):
            out[name] = (len(buf.shape), long[0], load)
    return out


def _inline(loader, vectors: dict):
    """`loader` with `vectors` (_vectors) computed from their bodies."""
    return (lambda h, i: loader(_Inline(h, vectors), i)) if vectors else loader


def statistics_prologue(g, x, rows: tuple):
    """A loader `(h, x_index, row) -> x's value` for the product of rows `rows` ([1, N]) that
    computes x's statistics per row, or None where x is no cheap function of statistics."""
    if not g.split_reductions:
        return None
    rows = tuple(sym(d) for d in rows)
    k = sympy.Symbol("k_probe", integer=True, nonnegative=True)
    at = (sympy.Integer(0), k)
    lx = _inline(x.loader, _vectors(g, _loads(x.loader, at)))
    nodes = _statistics(g, _loads(lx, at))
    if not nodes:
        return None
    cost = _ElementCost({b.name for n in nodes for b in n.buffers})
    lx(cost, at)
    if cost.expensive or cost.ops > MAX_ELEMENT_OPS:
        return None
    key = (tuple(n.buffers[0].name for n in nodes), tuple(rows))
    if key not in g.statistics:
        copies: dict = {}
        for node in nodes:
            copies.update(_copy(g, node, rows, copies))
        g.statistics[key] = copies
    copies = g.statistics[key]
    return lambda h, i, row: lx(_Redirect(h, copies, row), i)
