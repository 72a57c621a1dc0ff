"""Which kernel argument each runtime index of a kernel is read from: the `checks` of its plan
step (runtime/indices.py turns a failed check into a GuardError naming the model input, the
valid range and the first offending value).

An analysis handler runs each node's body with loads returning the set of buffers a value was
computed from; every `indirect` records that set with the size it indexes, whether negatives
wrap and the op. An index read from exactly one buffer the kernel takes as an argument points
at that argument; one computed inside the kernel (or from several buffers) has no argument,
and its error names the op and the range only.
"""
from __future__ import annotations

import sympy

from aotc.codegen.ir import NullHandler, Reduction, index_vars, size_texts
from aotc.artifact.builder import IndexCheck, size as plan_size

NO_SOURCE = frozenset()


class IndexUses(NullHandler):
    def __init__(self):
        self.uses: list[tuple[frozenset, object, bool, str]] = []

    def load(self, name, index):
        return frozenset({name})

    def constant(self, value, dtype):
        return NO_SOURCE

    def index_expr(self, expr, dtype):
        return NO_SOURCE

    def to_dtype(self, x, dtype):
        return x if isinstance(x, frozenset) else NO_SOURCE

    def op(self, op, *args):
        return NO_SOURCE.union(*(a for a in args if isinstance(a, frozenset)))

    def masked(self, mask, fn, other, dtype):
        value = fn()
        return value if isinstance(value, frozenset) else NO_SOURCE

    def indirect(self, value, size, wraps=True, op="aten::index.Tensor"):
        sources = value if isinstance(value, frozenset) else NO_SOURCE
        self.uses.append((sources, size, wraps, op))
        return sympy.Symbol(f"indirect{len(self.uses)}", integer=True, nonnegative=True)


def kernel_checks(kernel, args: list[str]) -> list[IndexCheck]:
    """The plan step's `checks` for a kernel whose arguments are the buffers `args`."""
    handler = IndexUses()
    for node in kernel.nodes:
        body = node.body
        if isinstance(body, Reduction):
            body.inner_fn(handler, index_vars("p", len(body.ranges)),
                          index_vars("r", len(body.reduction_ranges)))
        else:
            body.inner_fn(handler, index_vars("x", len(body.ranges)))
    checks, seen = [], set()
    for sources, size, wraps, op in handler.uses:
        arg = args.index(next(iter(sources))) if len(sources) == 1 and \
            next(iter(sources)) in args else None
        check = IndexCheck(arg=arg, size=plan_size(size_texts([sympy.sympify(size)])[0]),
                           wraps=wraps, op=op)
        if check not in seen:
            seen.add(check)
            checks.append(check)
    return checks
