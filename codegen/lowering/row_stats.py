"""A one-row product's normed input, computed by the product's own kernel.

A decoder layer's RMSNorm or LayerNorm is a reduction over one row (the mean of squares;
Welford's mean and m2) and a pointwise value that the next one-row product (the q/k/v, gate/up
or vocabulary projection, codegen/lowering/matvec.py) reads as its x. As two steps that is a
kernel of one program before each product, bound by latency: 2.5 us each on an H100, 33 of
them in a LLaMA-1B decode step (82 us of 787, benchmarks/results/h100-generate/marginal/).

Here the product's kernel computes the statistic itself. The statistic becomes a reduction
over the product's rows (1, N) whose body ignores the row: every program reduces the same row
of the hidden state, which the Triton kernel does once per program, as one [1, R] block (a
reduction whose value does not vary over the rows, codegen/triton/kernel.py), and its rows
share it (such kernels take at least SHARED_XBLOCK rows a program, codegen/triton/blocks.py).
x is inlined into the product with its reads of the statistic redirected there, so x too is
computed once per program, as a [1, R] block, then multiplied by each row's weights.

Applies where x is a lazy row that reads one element of a *row statistic* (`_statistic`);
its other loads (the hidden state, the norm's weight and bias, a token id) are x's own. The norm's
own kernel is left without readers and dropped (codegen/scheduler.py drop_unread); a norm
output that something else also reads is still stored by it.
"""
from __future__ import annotations

import sympy

from aotc.codegen.ir import ComputedBuffer, Reduction, ReductionType as R, index_vars, product

STATISTICS = frozenset({R.SUM, R.WELFORD, R.MAX})
MAX_ELEMENTS = 16384     # a statistic over more elements is left to its own kernel
MIN_COLUMNS = 128        # a product of fewer columns has too few programs to share it among


class _Redirect:
    """An ops handler that reads some buffers from elsewhere (name -> fn(handler)) and
    passes everything else to the handler it wraps."""

    def __init__(self, h, loads: dict):
        self._h, self._loads = h, loads

    def load(self, name, index):
        fn = self._loads.get(name)
        return fn(self._h) if fn is not None else self._h.load(name, index)

    def __getattr__(self, attr):
        return getattr(self._h, attr)


def _producer(g, name: str):
    for step in reversed(g.out.steps):
        if isinstance(step, ComputedBuffer) and any(b.name == name for b in step.buffers):
            return step
    return None


def _statistic(g, name: str):
    """The step computing buffer `name` where it is a row statistic: a reduction of the kinds
    in STATISTICS onto one element, over at most MAX_ELEMENTS static elements; else None."""
    step = _producer(g, name)
    if step is None or not isinstance(step.body, Reduction):
        return None
    body = step.body
    n = product(body.reduction_ranges)
    if body.reduction_type not in STATISTICS or product(body.ranges) != 1 or \
            not n.is_Integer or int(n) > MAX_ELEMENTS:
        return None
    return step


def _statistics_read(g, x) -> dict | None:
    """Buffer name -> its statistic step, for each statistic x (one row: [1, ..., K]) reads
    (at one element, the same for all of K); None where it reads none."""
    from aotc.codegen.scheduler import LoadRecorder
    rec, (k,) = LoadRecorder(), index_vars("k", 1)
    x.loader(rec, (sympy.Integer(0),) * (len(x.shape) - 1) + (k,))
    found = {}
    for name, index in rec.loads:
        if k not in sympy.sympify(index).free_symbols:   # one element: a statistic, or a
            step = _statistic(g, name)                     # token id, a scale
            if step is not None:
                found[name] = step
    return found or None


def _recomputed(g, step, rows) -> dict:
    """The buffers of `step`'s statistic computed over the product's `rows` (every row the
    same), by old buffer name; one per (statistic, rows), shared by the products reading it
    (a gate and an up projection of one normed input)."""
    key = (tuple(b.name for b in step.buffers), tuple(rows))
    if key not in g.row_stats:
        body, zeros = step.body, (sympy.Integer(0),) * len(step.body.ranges)
        fn = body.inner_fn
        outs = g.reduction(rows, body.reduction_ranges, body.reduction_type, body.dtype,
                           lambda h, idx, ridx: fn(h, zeros, ridx), "rowstat",
                           outputs=len(step.buffers))
        g.row_stats[key] = {b.name: o.buffer for b, o in zip(step.buffers, outs)}
    return g.row_stats[key]


def normed_row(g, tv) -> bool:
    """Whether lazy `tv` is one row that reads row statistics (a norm's output at batch 1 in
    a GPU graph): kept lazy even where several read it (the products that read it compute it
    themselves, `shared_vector`; any other reader that stores it stores it once)."""
    if not g.split_reductions or tv.buffer is not None or tv.body is None or not tv.shape:
        return False
    if any(d != 1 for d in tv.shape[:-1]) or not getattr(tv.shape[-1], "is_Integer", False):
        return False
    return _statistics_read(g, tv) is not None


def shared_vector(g, x, rows):
    """A loader (h, i, row) of x [1, K] that computes x inline, its row statistics read from
    reductions over the product's `rows` (1, N) (`row`: the product's row index); None where
    x is not such a value (the caller stores x once instead)."""
    if x.buffer is not None or len(rows) != 2 or not rows[1].is_Integer or \
            int(rows[1]) < MIN_COLUMNS:
        return None
    stats = _statistics_read(g, x)
    if stats is None:
        return None
    new = {}
    for step in {id(s): s for s in stats.values()}.values():
        new.update(_recomputed(g, step, rows))
    load = x.loader

    def loader(h, i, row):
        return load(_Redirect(h, {old: (lambda hh, b=b: b.loader()(hh, row))
                                  for old, b in new.items()}), i)
    return loader
