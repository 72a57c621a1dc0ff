"""argmax / argmin of long rows in two stages on GPU targets (the greedy token of a decode step).

One program per row reads a 32000-wide row of logits block after block, each block's load
waiting on the one before: on an H100 the argmax ending a LLaMA-1B decode step took 12 us and
GPT-2's (50257 wide) 15 us, 2-5% of the step (benchmarks/results/h100-generate/marginal/). Split
instead, each row cut into S chunks of c elements (the last one masked):

    stage 1 (rows x S programs):  m[r, s] = max over the chunk, i[r, s] = its first argmax
    stage 2 (rows programs):      s* = first argmax over s of m[r, s]
                                  out[r] = s* * c + sum over s of (i[r, s] where s == s*)

The result is the one-stage argmax exactly: the first chunk holding the row's extreme holds its
first occurrence, and within a chunk the first occurrence wins; a NaN wins as one stage's does
(max propagates it, argmax takes the first). Masked lanes hold the extreme's identity (-inf for
argmax), at indices past every real one, so they never win a tie. Stage 2's pick is a sum of
one element (no index load, so no index check). Static, floating rows of at least MIN_ELEMENTS
only; elsewhere one stage.
"""
from __future__ import annotations

import math

import torch

from aotc.codegen.ir import Op, ReductionType as R, sym

MIN_ELEMENTS = 4096       # shorter rows fit one persistent block (codegen/triton/blocks.py)
CHUNK = 1024              # elements a first-stage program reduces, about
MAX_CHUNKS = 256          # chunks a row at most (stage 2 reduces them in one block)
PROGRAMS = 264            # first-stage programs at most (blocks.SPLIT_PROGRAMS)


def plan_chunks(rows: int, n: int) -> tuple[int, int] | None:
    """(chunks, chunk length) for `rows` rows of `n` elements, or None for one stage."""
    if n < MIN_ELEMENTS or rows < 1 or 2 * rows > PROGRAMS:
        return None
    chunks = min(math.ceil(n / CHUNK), MAX_CHUNKS, PROGRAMS // rows)
    if chunks < 2:
        return None
    c = math.ceil(n / chunks)
    return math.ceil(n / c), c


def split_argreduce(g, x, dim: int, rtype: R, dtype):
    """The [rows] int64 index of `x`'s extreme along `dim` (R.ARGMAX or R.ARGMIN), in `dtype`
    (the accumulation dtype), as a lazy value, or None where one stage is kept."""
    if not g.split_reductions or not x.dtype.is_floating_point:
        return None
    shape = [int(d) if sym(d).is_Integer else None for d in x.shape]
    if None in shape:
        return None
    kept = [d for d in range(len(shape)) if d != dim]
    rows = math.prod(shape[d] for d in kept)
    plan = plan_chunks(rows, shape[dim])
    if plan is None:
        return None
    chunks, c = plan
    n = shape[dim]
    fill = float("-inf") if rtype == R.ARGMAX else float("inf")

    def chunk_value(h, idx, ridx):            # idx: (*row, s); ridx: (j,)
        k = idx[-1] * c + ridx[0]
        full = [None] * len(shape)
        for d, i in zip(kept, idx[:-1]):
            full[d] = i
        full[dim] = k
        load = lambda: h.to_dtype(x.loader(h, tuple(full)), dtype)   # noqa: E731
        if chunks * c == n:
            return load()
        inside = h.op(Op.LT, h.index_expr(k, torch.int64), h.constant(n, torch.int64))
        return h.masked(inside, load, fill, dtype)

    ranges = [shape[d] for d in kept]
    best = R.MAX if rtype == R.ARGMAX else R.MIN
    part, = g.reduction((*ranges, chunks), (c,), best, dtype, chunk_value, "argmax_chunks",
                        split=False)
    where, = g.reduction((*ranges, chunks), (c,), rtype, dtype, chunk_value, "argmax_chunks",
                         out_dtypes=[torch.int64], split=False)
    pl, wl = part.loader, where.loader
    first, = g.reduction(ranges, (chunks,), rtype, dtype,
                         lambda h, idx, ridx: pl(h, (*idx, ridx[0])), "argmax_of_chunks",
                         out_dtypes=[torch.int64], split=False)
    fl = first.loader

    def picked(h, idx, ridx):
        mine = h.op(Op.EQ, h.index_expr(ridx[0], torch.int64), fl(h, idx))
        return h.masked(mine, lambda: wl(h, (*idx, ridx[0])), 0, torch.int64)
    within, = g.reduction(ranges, (chunks,), R.SUM, torch.int64, picked, "argmax_within",
                          split=False)
    il = within.loader
    return g.pointwise(ranges, torch.int64, lambda h, idx: h.op(
        Op.ADD, h.op(Op.MUL, fl(h, idx), h.constant(c, torch.int64)), il(h, idx)), "argmax")
