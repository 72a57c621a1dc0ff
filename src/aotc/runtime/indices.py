"""Out-of-range indices: the GuardError a kernel's index check turns into.

Kernels that index with runtime values (embedding rows, gather, index_select, advanced
indexing) check each index against the size it indexes; negative indices wrap only for the ops
that wrap in eager PyTorch (aten.index), and are refused elsewhere, as eager refuses them. A
failed check is reported here, on the cold path: the plan step's `checks` say which kernel
argument held the index, the size and the op; the argument is traced back through views to
the model input it came from, and the first offending value is named with its position.
Plans without generated kernels (--no-codegen) index through ATen, whose own check raises an
IndexError: `extern_index_error` finds the indexing call and the input behind it the same way.
"""
from __future__ import annotations

import torch

from aotc.errors import GuardError
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.types import SlotKind, StepKind


def input_origin(plan, slot: int) -> int | None:
    """The position among the plan's inputs of the input `slot` views (or is), else None."""
    views = {s.out[0]: s.args[0].slot for s in plan.steps
             if s.kind is StepKind.VIEW and s.out and s.out[0] is not None
             and s.args and hasattr(s.args[0], "slot")}
    seen = 0
    while slot in views and seen < 64:
        slot, seen = views[slot], seen + 1
    if plan.slots[slot].kind is SlotKind.INPUT and slot in plan.inputs:
        return plan.inputs.index(slot)
    return None


def first_bad(t: torch.Tensor, lo: int, hi: int) -> tuple[int, tuple] | None:
    """(value, position) of the first element of `t` outside [lo, hi], or None."""
    t = t.detach().to("cpu")
    if t.is_floating_point() or t.dtype == torch.bool:
        return None
    bad = (t < lo) | (t > hi)
    if not bool(bad.any()):
        return None
    pos = tuple(int(i) for i in bad.nonzero()[0])
    return int(t[pos]), pos


def index_error(plan, step, tensors: dict, inputs, symbols: dict) -> GuardError:
    """The error for kernel step `step` having met an out-of-range index. `tensors`: kernel
    argument position -> the tensor passed there (where still at hand); `inputs`: the plan's
    inputs, to search when an argument came from one. Kernels of one shape share their error
    code (codegen/triton/build.py share_codes), so where `step`'s own arguments hold no bad
    index, the other steps storing its code are searched too (through the plan's inputs)."""
    code = getattr(getattr(step, "launch", None), "error_code", None)
    others = [s for s in plan.steps if code and s is not step and s.kind is StepKind.KERNEL
              and s.launch is not None and s.launch.error_code == code]
    for s, at_hand in [(step, tensors), *((o, {}) for o in others)]:
        found = _find_bad(plan, s, at_hand, inputs, symbols)
        if found is not None:
            return found
    ops = sorted({c.op for c in step.checks}) or ["an indexing op"]
    return GuardError(f"an index is out of range in {', '.join(ops)} (kernel {step.name})",
                      where=f"kernel {step.name}", expected="indices within the indexed dim",
                      found="an index out of range",
                      fix="check the values of integer index inputs (e.g. token ids below the "
                          "vocabulary size)")


def _find_bad(plan, step, tensors: dict, inputs, symbols: dict) -> GuardError | None:
    """The error naming the first out-of-range index one of `step`'s checks finds in the
    tensors at hand or the plan's inputs, else None."""
    names = {i: plan.slots[s].name for i, s in enumerate(plan.inputs)}
    for check in step.checks:
        size = ex.evaluate(check.size, symbols) if not isinstance(check.size, int) else check.size
        lo, hi = (-size if check.wraps else 0), size - 1
        origin = None if check.arg is None else input_origin(plan, step.args[check.arg])
        candidates = []
        if check.arg in tensors:
            candidates.append(tensors[check.arg])
        if origin is not None and inputs is not None and origin < len(inputs):
            candidates.append(inputs[origin])
        for t in candidates:
            found = first_bad(t, lo, hi) if isinstance(t, torch.Tensor) else None
            if found is not None:
                return _out_of_range(found, names.get(origin), origin, check.op, size,
                                     check.wraps)
    return None


def _out_of_range(found: tuple, name: str | None, origin: int | None, op: str, size: int,
                  wraps: bool) -> GuardError:
    """The GuardError for index `found` = (value, position) outside the `size` rows `op`
    indexes, read from input `name` (#`origin`) or computed inside the model (name None)."""
    value, pos = found
    lo, hi = (-size if wraps else 0), size - 1
    where = f"input {name!r} (#{origin})" if name is not None \
        else f"an index computed inside the model ({op})"
    return GuardError(
        f"{where} holds index {value} at position {list(pos)}, outside [{lo}, {hi}]",
        where=where, expected=f"indices in [{lo}, {hi}] ({op} over {size} rows"
        + (", negatives counted from the end)" if wraps else ")"),
        found=f"{value} at {list(pos)}",
        fix=f"pass indices in [{lo}, {hi}]" + ("" if name is None else
                                              f" in {name!r} (e.g. token ids below the "
                                              f"vocabulary size {size})"))


# ATen indexing calls a plan may make: op -> (the argument holding the indices, the argument
# holding the indexed dim, None for dim 0); the indexed tensor is argument 0
EXTERN_INDEXING = {"aten::embedding": (1, None), "aten::index_select": (2, 1),
                   "aten::gather": (2, 1)}


def extern_index_error(plan, inputs, symbols: dict) -> GuardError | None:
    """The GuardError for an ATen indexing call of `plan` whose indices, read from a model
    input, are out of range (negatives too: these ops do not wrap), or None if none is."""
    names = {i: plan.slots[s].name for i, s in enumerate(plan.inputs)}
    for step in plan.steps:
        spec = EXTERN_INDEXING.get(step.op.split(".")[0]) if step.kind is StepKind.EXTERN \
            else None
        if spec is None or len(step.args) <= spec[0]:
            continue
        table, index = step.args[0], step.args[spec[0]]
        dim = 0 if spec[1] is None else step.args[spec[1]]
        if not (hasattr(index, "slot") and hasattr(table, "slot") and isinstance(dim, int)):
            continue
        origin = input_origin(plan, index.slot)
        shape = plan.slots[table.slot].shape
        if origin is None or origin >= len(inputs) or not -len(shape) <= dim < len(shape):
            continue
        size = shape[dim] if isinstance(shape[dim], int) else ex.evaluate(shape[dim], symbols)
        found = first_bad(inputs[origin], 0, size - 1)
        if found is not None:
            return _out_of_range(found, names[origin], origin, step.op, size, False)
    return None
