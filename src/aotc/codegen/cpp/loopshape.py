"""Loop-shape decisions for C++ reductions, read off the indices a body loads (no emission).

* `merge_reduced_dims`: adjacent reduced dims that every load walks as one contiguous run
  become one loop (a per-channel batch-norm sum over [n, h, w] loops over n and h*w), so the
  vectorized inner loop is long instead of a row of w.
* `column_nodes`: a kernel of sums whose reads run along its last output dim and stride over
  the reduced dim (bias gradients: the column sums of a [rows, features] matrix) is reduced
  row by row into blocks of accumulators, vectorized along the columns
  (`KernelWriter.column_source`).
"""
from __future__ import annotations

import sympy

from aotc.codegen.ir import (FloorDiv, ModIndex, Reduction, ReductionType as R, index_vars,
                             replace, simplify_index)
from aotc.codegen.scheduler import LoadRecorder


def reduction_loads(body: Reduction, pvars: tuple, ranges: dict) -> tuple[tuple, list]:
    """(reduction loop vars, the index of every load in `body`, simplified over the kernel's
    (`ranges` of `pvars`) and the reduction's ranges, and expanded)."""
    rvars = index_vars("r", len(body.reduction_ranges))
    rec = LoadRecorder()
    body.inner_fn(rec, pvars, rvars)
    ranges = {**ranges, **dict(zip(rvars, body.reduction_ranges))}
    return rvars, [sympy.expand(simplify_index(i, ranges)) for _, i in rec.loads]


def merge_reduced_dims(body: Reduction, pvars: tuple, ranges: dict) -> Reduction:
    """`body` with its contiguous adjacent reduced dims merged into one (module docstring)."""
    while len(body.reduction_ranges) >= 2:
        sizes = body.reduction_ranges
        if not (sizes[-1].is_Integer and sizes[-2].is_Integer):
            break
        rvars, loads = reduction_loads(body, pvars, ranges)
        a, b = rvars[-2], rvars[-1]
        if not loads or any(i.coeff(b) == 0 or sympy.expand(i.coeff(a) - sizes[-1] *
                                                              i.coeff(b)) != 0
                            for i in loads):
            break
        n, fn = sizes[-1], body.inner_fn
        merged = lambda h, p, r, fn=fn, n=n: fn(h, p, (*r[:-1], FloorDiv(r[-1], n),
                                                     ModIndex(r[-1], n)))
        body = replace(body, reduction_ranges=(*sizes[:-2], sizes[-2] * n), inner_fn=merged)
    return body


def column_nodes(nodes: list, pvars: tuple, ranges: dict, stored: set) -> list | None:
    """`nodes` if all are stored sums or products over the same reduced dims whose reads run
    contiguously along the last output dim and stride over the innermost reduced dim (a layer
    norm's weight and bias gradients, fused horizontally, qualify together); else None."""
    if not pvars or not nodes:
        return None
    first = nodes[0].body
    for node in nodes:
        body = node.body
        if (not isinstance(body, Reduction) or body.reduction_type not in (R.SUM, R.PROD)
                or len(node.buffers) != 1 or node.buffers[0].name not in stored
                or not body.reduction_ranges
                or tuple(body.reduction_ranges) != tuple(first.reduction_ranges)):
            return None
        rvars, loads = reduction_loads(body, pvars, ranges)
        last, inner = pvars[-1], rvars[-1]
        # some read runs along the columns; none runs along the reduced dim as well (a per-row
        # statistic, constant along the columns, is broadcast)
        if not any(i.coeff(last) == 1 for i in loads) or \
                any(i.coeff(inner) == 1 and i.coeff(last) != 0 for i in loads):
            return None
    return list(nodes)
