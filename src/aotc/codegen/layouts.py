"""Weight layouts for matmuls on the CPU: which linear-layer weights are stored transposed.

A linear layer reaches the plan as `mm(x, permute(W, [1, 0]))`, W of shape [N, K] as PyTorch
keeps it. torch's CPU BLAS runs that product with a transposed operand ("NT"); with W stored
as [K, N] (row-major W^T) the same product is "NN". Measured on the 2-core Xeon with torch
2.13's MKL, one thread (M rows of x):

    M <= 32           NN is 1.1x-3.2x faster for every weight size measured (small-M paths)
    64 <= M < 256     NN is 1.06x-1.43x faster for weights of K*N <= 2**20 elements; for larger
                      ones either can win (NT by up to 1.3x at 128 x 768 x 3072)
    M >= 256          equal within 3% (both packed), NN never slower by more than noise

so a weight is stored transposed when every matmul that reads it has M <= 32 rows, or when it
has at most 2**20 elements (where NN never loses). Dynamic M is judged at its declared maximum.
The choice is a fixed rule, not a timing, so exports stay reproducible.

A transposed weight is stored in weights.safetensors as its [K, N] transpose under its own name;
its plan slot keeps the logical shape [N, K] with strides [1, N] and says
`"layout": "transposed"`; the runtime binds it as `stored.t()` (a view: no copy, no load-time
cost) and the plan's `permute(W, [1, 0])` then yields the contiguous [K, N] operand. Only
weights read by nothing but that permute, whose result feeds nothing but matmuls as their
right-hand operand, qualify: no kernel or other op ever sees the changed strides.
"""
from __future__ import annotations

from aotc.codegen.ir import dims, sym
from aotc.codegen.scheduler import Kernel
from aotc.artifact.schema.plan import CallStep, SlotRef, slot_refs
from aotc.artifact.schema.types import SlotKind, StepKind

SMALL_M = 32
SMALL_WEIGHT = 2 ** 20
# matmul ops whose right-hand operand a transposed weight may be: op -> its argument position
RIGHT_OPERAND = {"aten::mm.default": 1, "aten::addmm.default": 2}


def transposed_matmul_weights(plan, steps: list, outputs: list, rows_at: dict,
                              weights: dict, aliases: dict, *, allowed=None,
                              apply: bool = True, profit: bool = True) -> list[str]:
    """Mark the weights worth storing transposed (see the module docstring): their slots get
    `layout: transposed` and strides [1, N], the permute's result slot becomes contiguous
    (`plan`: the entry's PlanBuilder).
    `rows_at`: size symbol -> the value M is judged at (declared maxima); `weights`: name ->
    tensor (shapes only); `aliases`: tied names (left alone: another name shares the storage).
    Returns the names chosen, for the caller to store transposed. With several plans over the
    same weights (a generator's entries), the caller asks each plan first (`apply=False`) and
    then applies the names every plan reading them chose (`allowed`); `profit=False` asks
    only whether the layout can be taken (the weight's one reader is a transpose feeding
    matmuls), not whether it pays at this plan's sizes."""
    readers: dict[int, list] = {}
    for step in steps:
        for sid in _reads(step):
            readers.setdefault(sid, []).append(step)
    for o in outputs:
        if o.slot is not None:
            readers.setdefault(o.slot, []).append(o)
    tied = set(aliases) | set(aliases.values())
    chosen = []
    for step in steps:
        if not _is_transpose(step, plan):
            continue
        w, out = step.args[0].slot, step.out[0]
        name = plan.slot(w).weight
        if name is None or name in tied or readers.get(w) != [step] or \
                plan.slot(w).memory_format or weights[name].dim() != 2 or \
                (allowed is not None and name not in allowed):
            continue
        users = readers.get(out, [])
        rows = [_rows(u, out, plan, rows_at) for u in users]
        if not users or any(r is None for r in rows):
            continue
        n, k = weights[name].shape
        if profit and not (max(rows) <= SMALL_M or n * k <= SMALL_WEIGHT):
            continue
        if apply:
            plan.update(w, layout="transposed", stride=[1, n], contiguous=False)
            plan.update(out, stride=[n, 1], contiguous=True)
        chosen.append(name)
    return chosen


def _reads(step) -> list[int]:
    if isinstance(step, Kernel):
        return sorted(int(n[3:]) for n in step.reads if n.startswith("buf"))
    return sorted(set(step.reads()))


def _is_transpose(step, plan) -> bool:
    """A view step `permute(W, [1, 0])` / `t(W)` / `transpose(W, 0, 1)` of a weight slot."""
    if not isinstance(step, CallStep) or step.kind is not StepKind.VIEW or len(step.out) != 1:
        return False
    args = step.args
    if not args or not isinstance(args[0], SlotRef):
        return False
    if plan.slot(args[0].slot).kind is not SlotKind.WEIGHT:
        return False
    op = step.op
    if op == "aten::t.default":
        return True
    if op == "aten::permute.default":
        return list(args[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0])
    if op == "aten::transpose.int":
        return sorted(d % 2 for d in args[1:3]) == [0, 1]
    return False


def _rows(user, operand: int, plan, rows_at: dict) -> int | None:
    """M of a matmul that takes `operand` as its right-hand side, at `rows_at`; None for any
    other use."""
    if not isinstance(user, CallStep) or user.kind is not StepKind.EXTERN:
        return None
    pos = RIGHT_OPERAND.get(user.op)
    args = user.args
    if pos is None or len(args) <= pos or args[pos] != SlotRef(operand) or user.kwargs or \
            operand in slot_refs(args[:pos]):
        return None
    left = args[pos - 1]
    if not isinstance(left, SlotRef):
        return None
    m = dims(plan.slot(left.slot).shape[:1])[0]
    m = m.subs({s: rows_at.get(s.name, s) for s in m.free_symbols})
    return int(m) if m.is_Integer else None


def relaid(values: list, plan, base) -> bool:
    """Whether `base` (a TensorValue) was stored with other strides than the graph's value has:
    a kernel writes its outputs contiguous, and export's layout of a dynamic-shape conv output
    may not be. A view's strides in the graph then do not describe the view of the stored
    tensor, so the view is computed into a buffer of its own instead."""
    # a slot lowering made (a hand-written kernel's output) has no graph value: stored as made
    meta = values[base.vid] if base.vid is not None and base.vid < len(values) else None
    if not meta or "stride" not in meta or base.buffer is None or base.buffer.slot != base.vid:
        return False
    slot = plan.slot(base.buffer.slot)
    return any(sym(a) != b for a, b, n in zip(meta["stride"], dims(slot.stride), dims(slot.shape))
               if n != 1)
