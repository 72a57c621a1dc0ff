"""When a C++ kernel runs on several threads: from the work it does, not its size alone.

OpenMP's team start-up and hand-off cost a few microseconds a call, so small kernels run on
one thread. Counting elements alone kept a fused chain of layer norms, GELU and softmax over
64 x 256 serial (16384 elements, each pass over a row doing tens of operations, erf and exp
among them): 191 us on one thread and on two. The work of a kernel is counted per node, as
the elements of its iteration space (rows times reduced elements) times the operations of
its body per element, expensive ones (exp, erf, tanh, ...) weighted as several. A kernel runs
in parallel when its elements reach PARALLEL_MIN_ELEMENTS (a plain copy or add is worth it
from there) or its weighted work reaches PARALLEL_MIN_WORK (four operations per element at
that size).
"""
from __future__ import annotations

import sympy

from aotc.codegen.ir import Reduction, index_vars, product

PARALLEL_MIN_ELEMENTS = 32768   # below this (and below PARALLEL_MIN_WORK) one thread
PARALLEL_MIN_WORK = 4 * PARALLEL_MIN_ELEMENTS
EXPENSIVE_WEIGHT = 8            # an exp, erf or tanh costs about as much as this many adds


def elements(kernel) -> sympy.Expr:
    """The largest iteration space among the kernel's nodes (rows times reduced elements)."""
    sizes = [product(n.body.ranges) * (product(n.body.reduction_ranges)
                                       if isinstance(n.body, Reduction) else 1)
             for n in kernel.nodes]
    return max(sizes, key=lambda e: int(e) if e.is_Integer else 1 << 62)


def weighted_work(kernel) -> sympy.Expr:
    """Sum over nodes of elements times operations per element (expensive ones weighted)."""
    from aotc.codegen.graph import CostCounter
    total = sympy.Integer(0)
    for n in kernel.nodes:
        b, c = n.body, CostCounter()
        if isinstance(b, Reduction):
            b.inner_fn(c, index_vars("x", len(b.ranges)), index_vars("r", len(b.reduction_ranges)))
            size = product(b.ranges) * product(b.reduction_ranges)
        else:
            b.inner_fn(c, index_vars("x", len(b.ranges)))
            size = product(b.ranges)
        total += size * (1 + c.ops + (EXPENSIVE_WEIGHT - 1) * c.expensive)
    return total


def worth_threads(kernel) -> bool:
    """Static sizes: whether the kernel's work pays for a thread team."""
    return int(elements(kernel)) >= PARALLEL_MIN_ELEMENTS or \
        int(weighted_work(kernel)) >= PARALLEL_MIN_WORK


def threads_condition(kernel, cexpr) -> str:
    """Dynamic sizes: the C++ test of the same rule, evaluated at each call."""
    return (f"({cexpr(elements(kernel))} >= {PARALLEL_MIN_ELEMENTS} || "
            f"{cexpr(weighted_work(kernel))} >= {PARALLEL_MIN_WORK})")
