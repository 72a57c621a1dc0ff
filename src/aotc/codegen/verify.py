"""The IR verifier, run between lowering and scheduling.

Checks every realized node: its body runs, loads only buffers that exist (plan slots or earlier
nodes), indexes them with integer expressions over its own loop variables (plus runtime indices
from `indirect`), and its iteration space matches its output buffers. A failure names the node
and the ATen ops that produced it.
"""
from __future__ import annotations

import sympy

from aotc.codegen.ir import ComputedBuffer, NullHandler, Reduction, index_vars
from aotc.errors import LoweringError


class _Checker(NullHandler):
    def __init__(self, known: set, allowed: set, where: str):
        self.known, self.allowed, self.where = known, allowed, where

    def _fail(self, what: str, found) -> None:
        raise LoweringError(f"invalid loop IR in {self.where}: {what}", where=self.where,
                            expected="loads of known buffers over the node's loop variables",
                            found=found, fix="report this as an aotc bug (the lowering of the "
                                             "ops named in 'where' is wrong)")

    def load(self, name, index):
        if name not in self.known:
            self._fail(f"load of unknown buffer {name}", name)
        index = sympy.sympify(index)
        stray = {s for s in index.free_symbols if s not in self.allowed and not s.is_positive
                 and not s.name.startswith("indirect")}   # dim sizes may appear in strides
        if stray:
            self._fail(f"index of {name} uses variables outside the loop nest", sorted(map(str, stray)))
        return 0



def verify_lowered(lowered) -> None:
    known = {f"buf{s.id}" for s in lowered.slots if s.is_tensor}
    for step in lowered.steps:
        if not isinstance(step, ComputedBuffer):
            continue
        body = step.body
        where = f"{', '.join(b.name for b in step.buffers)} ({'+'.join(body.origins)})"
        idx = index_vars("x", len(body.ranges))
        for b in step.buffers:
            if tuple(b.shape) != tuple(body.ranges):
                raise LoweringError(f"invalid loop IR in {where}: output shape mismatch",
                                    where=where, expected=list(body.ranges), found=list(b.shape),
                                    fix="report this as an aotc bug")
        if isinstance(body, Reduction):
            ridx = index_vars("r", len(body.reduction_ranges))
            body.inner_fn(_Checker(known, set(idx) | set(ridx), where), idx, ridx)
        else:
            body.inner_fn(_Checker(known, set(idx), where), idx)
