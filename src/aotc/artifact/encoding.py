"""The argument encoding Programs and plans share, and plan rewrites the runtime makes at load.

A plan (plans/<entry>.json) lists slots (one per value: input, weight or intermediate, with its
symbolic shape and dtype) and ordered steps; its typed form and parser are in
artifact/schema/plan.py, and codegen builds it through artifact/builder.py. The exporter encodes
the arguments of a Program's nodes with `encode_arg` ({"slot": n}, {"sym": "2*batch"}, tagged
torch enums), the form plan steps store them in; `slots_in` lists the slots such an encoded
argument names. `without_outputs` prunes a typed plan at load (a training backward whose inputs
need no gradient).
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from aotc.artifact.dtypes import DTYPE_NAMES, LAYOUTS, MEMORY_FORMATS
from aotc.artifact.schema.plan import Output
from aotc.artifact.schema.types import SlotKind, StepKind  # noqa: F401 - re-exported


def slots_in(arg) -> list[int]:
    """The slots an encoded argument (or list of them) refers to."""
    if isinstance(arg, list):
        return [s for a in arg for s in slots_in(a)]
    if isinstance(arg, dict) and "slot" in arg:
        return [arg["slot"]]
    return []


def without_outputs(plan, dropped: set[int]):
    """A copy of typed `plan` whose outputs at the positions in `dropped` are constants None
    and that runs only the steps the other outputs need (a training backward whose callers
    want no input gradients). Kernels are kept whole (one that also writes a needed buffer
    runs as it is); frees of slots no kept step binds are left out, and a kept kernel whose
    recycled buffer (`reuse`) is no longer produced allocates its own."""
    outputs = tuple(Output(const=None) if i in dropped and o.slot is not None else o
                    for i, o in enumerate(plan.outputs))
    live = {o.slot for o in outputs if o.slot is not None}
    kept = []
    for step in reversed(plan.steps):
        if step.kind is not StepKind.FREE:
            if not live & {o for o in step.out if o is not None}:
                continue
            step = _masked(step, live)
            live |= set(step.reads())
        kept.append(step)
    kept.reverse()
    bound = set(plan.inputs) | {i for i, s in enumerate(plan.slots)
                                if s.kind is SlotKind.WEIGHT}
    steps = []
    for step in kept:
        if step.kind is StepKind.FREE:
            step = replace(step, slots=tuple(s for s in step.slots if s in bound),
                           donate=tuple(s for s in step.donate if s in bound))
            if step.slots or step.donate:
                steps.append(step)
            continue
        if step.kind is StepKind.KERNEL and step.reuse:
            step = replace(step, reuse=tuple((o, d) for o, d in step.reuse if d in bound))
        bound |= {o for o in step.out if o is not None}
        steps.append(step)
    return replace(plan, outputs=outputs, steps=tuple(steps))


# backward ops that take an `output_mask` (the position of that argument): a result nobody
# reads is not computed at all (a first convolution's input gradient)
OUTPUT_MASKS = {"aten::convolution_backward.default": 10,
                "aten::native_layer_norm_backward.default": 7,
                "aten::native_group_norm_backward.default": 9}


def _masked(step, live: set):
    pos = OUTPUT_MASKS.get(step.op) if step.kind is StepKind.EXTERN else None
    if pos is None or len(step.args) <= pos or not isinstance(step.args[pos], tuple):
        return step
    mask = tuple(bool(m) and o is not None and o in live
                 for m, o in zip(step.args[pos], step.out))
    if mask == tuple(step.args[pos]):
        return step
    args = list(step.args)
    args[pos] = mask
    return replace(step, args=tuple(args),
                   out=tuple(o if m else None for o, m in zip(step.out, mask)))


_LAYOUT_NAMES = {v: k for k, v in LAYOUTS.items()}
_FORMAT_NAMES = {v: k for k, v in MEMORY_FORMATS.items()}


def encode_arg(value, ref):
    """JSON form of one op argument; `ref(node)` maps a graph value to its encoding: a tensor
    to {"slot": n}, a symbolic integer to {"sym": "2*batch"}."""
    if isinstance(value, (list, tuple)):
        return [encode_arg(v, ref) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": DTYPE_NAMES[value]}
    if isinstance(value, torch.device):
        return {"device": value.type}
    if isinstance(value, torch.layout):
        return {"layout": _LAYOUT_NAMES[value]}
    if isinstance(value, torch.memory_format):
        return {"memory_format": _FORMAT_NAMES[value]}
    return ref(value)
