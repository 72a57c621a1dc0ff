"""Load-time folding: the steps of a plan whose every input is fixed at load run once, then.

A plan's weights do not change between calls (inference: `static_weights`), so neither does
anything computed from weights alone, nor what is computed from nothing (an index pattern,
a DFT matrix, a mask from `arange` at static sizes). Models compute such values on every
call: a weight-normalised convolution's weight (wav2vec2, HuBERT), T5's relative position
bias, FNet's DFT matrices, rotary tables at a static length. Both runners take them once:

- a view of fixed values (weights, folded results): taken at load (both runners);
- an ATen call reading only fixed values, with no size symbol in its arguments, neither
  mutating nor random: called at load (both runners; the runner file marks it `fold`);
- a generated kernel reading only fixed values, with no size argument and a constant grid:
  run at load by the Python runner (runtime/executor.py), and by the C++ runner for C++
  kernels (runtime/cpp/program.cpp; it runs Triton kernels per call). Constants that change
  between calls (a generator's state, a training step's weights) are never fixed.

What is folded stays allocated for the module's life, so a result is folded only where it
is no larger than `FOLD_BYTES` or than the fixed values it reads (a broadcast of a small
constant to a batch-sized mask stays a per-call computation). Folded tensors are kept with
the recipe that made them: after weights are swapped in place they are recomputed in place
(`PlanFunction.refresh`), so pointers bound into plans and CUDA graphs stay valid.
"""
from __future__ import annotations

import torch

from aotc.artifact.dtypes import DTYPES
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.plan import arg_names
from aotc.artifact.schema.types import StepKind

FOLD_BYTES = 16 << 20


def foldable(step, folded: set, slots, resolve) -> bool:
    """A call step (view or ATen op) that can run once, at load: see the module doc.
    `resolve(qualname)` gives the op, for its schema and tags (extern steps)."""
    if step.kind is StepKind.VIEW:
        reads = step.reads()
        return (len(step.out) == 1 and step.out[0] is not None and bool(reads)
                and all(r in folded for r in reads) and not _symbolic(step))
    if step.kind is not StepKind.EXTERN or step.binds:   # a value-dependent size: per call
        return False
    if not (step.single and len(step.out) == 1 and step.out[0] is not None) or _symbolic(step):
        return False
    if step.op.startswith("aotc::") or not all(r in folded for r in step.reads()):
        return False
    op = resolve(step.op)
    schema = getattr(op, "_schema", None)
    if schema is None or schema.is_mutable or torch.Tag.nondeterministic_seeded in op.tags:
        return False
    return _small(step.out, step.reads(), slots)


def kernel_foldable(step, folded: set, slots) -> bool:
    """A generated kernel that can run once, at load (the Python runner): every argument
    fixed, no size argument, a grid of constants, outputs of static shapes within bounds."""
    if step.kind is not StepKind.KERNEL or step.sizes or not step.out:
        return False
    if not all(a in folded for a in step.args):
        return False
    if step.launch is not None and any(ex.names(g) for g in step.launch.grid):
        return False
    return _small(step.out, step.args, slots)


def _symbolic(step) -> bool:
    return bool(arg_names((*step.args, *(v for _, v in step.kwargs))))


def static_bytes(slot) -> int | None:
    """A slot's size in bytes, None unless its shape is static."""
    if not all(isinstance(d, int) for d in slot.shape) or slot.dtype not in DTYPES:
        return None
    n = 1
    for d in slot.shape:
        n *= d
    return n * DTYPES[slot.dtype].itemsize


def _small(outs, reads, slots) -> bool:
    out = [static_bytes(slots[o]) for o in outs]
    if any(b is None for b in out):
        return False
    read = sum(static_bytes(slots[r]) or 0 for r in set(reads))
    return sum(out) <= max(FOLD_BYTES, read)
