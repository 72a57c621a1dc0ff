"""Plan finishing: lowered steps in, the steps of a launch plan (plans/<entry>.json) out.

Buffer lifetimes are planned here: after the last use of a value (or an input) a FREE step
drops it, and multi-output results nobody reads are never bound. Kernel outputs reuse the storage of dead
buffers of the same byte size (memory planning). The planner also simulates the plan to report
the peak of live intermediate bytes. Steps are typed (artifact/schema/plan.py), made and
revised through the entry's PlanBuilder (artifact/builder.py), which checks each one.
"""
from __future__ import annotations

from collections import Counter

import torch

from aotc.artifact.dtypes import DTYPES
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.types import SlotKind, StepKind


def torch_op(qualname: str):
    """'aten::addmm.default' -> torch.ops.aten.addmm.default (aotc's own ops too, registered
    by aotc.nn). Codegen reads graphs its exporter wrote; runtime/executor.py resolves plan
    ops only from its fixed tables."""
    import aotc.nn  # noqa: F401 - registers aotc::decode_attention
    ns, rest = qualname.split("::")
    name, overload = rest.rsplit(".", 1)
    return getattr(getattr(getattr(torch.ops, ns), name), overload)


def is_view(op) -> bool:
    ret = op._schema.returns
    return bool(ret) and ret[0].alias_info is not None and not ret[0].alias_info.is_write


def finalize(plan, steps: list, outputs: list, bindings: dict | None = None
             ) -> tuple[list, dict]:
    """Frees, buffer reuse and statistics of the typed `steps` over `plan` (a PlanBuilder):
    (the plan's steps, its stats). Symbolic sizes are measured at `bindings` (the declared
    maxima) for the memory statistics."""
    outs = {o.slot for o in outputs if o.slot is not None}
    last_use = {}
    for idx, step in enumerate(steps):
        for b in getattr(step, "binds", ()):   # a result read for its size: kept
            last_use[step.out[b.out]] = idx
        for s in step.reads():
            last_use[s] = idx
    for step in steps:   # views keep their base alive as long as they live
        if step.kind is StepKind.VIEW:
            base = step.reads()[0]
            for o in step.out:
                if o is not None:
                    root = plan.slot(base).base
                    plan.update(o, base=base if root is None else root)
    final = []
    for idx, step in enumerate(steps):
        if step.kind is not StepKind.KERNEL:
            out = tuple(o if (o in last_use or o in outs) else None for o in step.out)
            step = step if out == step.out else plan.revise(step, out=out)
        final.append(step)
        # inputs too: a caller that hands its inputs over (runtime/executor.py: a list the
        # plan empties, as a training backward does with what forward saved) frees each one
        # after its last read
        dead = sorted(s for s, last in last_use.items() if last == idx and s not in outs
                      and plan.slot(s).kind in (SlotKind.VALUE, SlotKind.INPUT))
        if dead:
            final.append(plan.free(dead))
    stats = plan_stats(plan, final, bindings)
    stats["peak_bytes_without_reuse"] = stats["peak_bytes"]
    final = plan_reuse(plan, final)
    stats["peak_bytes"] = plan_stats(plan, final, bindings)["peak_bytes"]
    return final, stats


def plan_reuse(plan, steps: list) -> list:
    """Let kernel outputs take over the storage of dead kernel buffers of the same dtype and
    size. A buffer is dead at the FREE step that drops it together with its last live view; that
    FREE step then keeps it bound (`donate`) and the kernel step names it (`reuse`)."""
    takers: dict[tuple, list] = {}
    views: dict[int, set] = {}
    for idx, step in enumerate(steps):
        if step.kind is StepKind.KERNEL:
            for o in step.out:
                takers.setdefault(_key(plan.slot(o)), []).append((idx, o))
        for o in getattr(step, "out", ()):
            if o is not None and plan.slot(o).base is not None:
                views.setdefault(plan.slot(o).base, set()).add(o)
    taken, freed = set(), set()
    changes: dict[int, dict] = {}      # step index -> {"slots"/"donate"/"reuse": [...]}
    for idx, step in enumerate(steps):
        if step.kind is not StepKind.FREE:
            continue
        freed |= set(step.slots)
        for s in step.slots:
            slot = plan.slot(s)
            if slot.producer is not StepKind.KERNEL or not views.get(s, set()) <= freed \
                    or _key(slot) is None:
                continue
            taker = next(((i, o) for i, o in takers.get(_key(slot), [])
                          if i > idx and o not in taken), None)
            if taker is None:
                continue
            taken.add(taker[1])
            free = changes.setdefault(idx, {"slots": list(step.slots), "donate": []})
            free["slots"].remove(s)
            free["donate"].append(s)
            changes.setdefault(taker[0], {"reuse": []})["reuse"].append((taker[1], s))
    out = []
    for idx, step in enumerate(steps):
        change = changes.get(idx)
        if change is not None:
            step = plan.revise(step, **{k: tuple(v) for k, v in change.items()})
        if step.kind is not StepKind.FREE or step.slots or step.donate:
            out.append(step)
    return out


def _key(slot):
    if not slot.is_tensor or not all(isinstance(d, int) for d in slot.shape):
        return None
    return slot.dtype, nbytes(slot)


def nbytes(slot, bindings: dict | None = None) -> int:
    if not slot.is_tensor:
        return 0
    n = DTYPES[slot.dtype].itemsize
    for d in slot.shape:
        if not isinstance(d, int):
            if bindings is None:
                return 0
            d = ex.evaluate(d, bindings)
        n *= d
    return n


def plan_stats(plan, steps: list, bindings: dict | None = None) -> dict:
    """Step counts, op counts and the peak of live intermediate bytes (views share storage)."""
    live: dict[int, set] = {}          # storage root -> live slots viewing it
    cur = peak = 0
    reused = set()
    for step in steps:
        reused |= {o for o, _ in getattr(step, "reuse", ())}
        if step.kind is StepKind.FREE:
            for s in step.slots:
                root = _root(plan, s)
                live.get(root, set()).discard(s)
                if root in live and not live[root]:
                    del live[root]
                    cur -= nbytes(plan.slot(root), bindings)
            continue
        for o in step.out:
            if o is None:
                continue
            root = _root(plan, o)
            if plan.slot(root).kind is not SlotKind.VALUE:
                continue
            if root not in live:
                live[root] = set()
                cur += 0 if o in reused else nbytes(plan.slot(root), bindings)
            live[root].add(o)
        peak = max(peak, cur)
    kinds = Counter(s.kind.value for s in steps)
    ops = Counter(s.op for s in steps if hasattr(s, "op"))
    return {"steps": dict(sorted(kinds.items())), "ops": dict(sorted(ops.items())),
            "peak_bytes": peak}


def _root(plan, sid: int) -> int:
    """The slot whose storage slot `sid` uses (its view base, or itself)."""
    base = plan.slot(sid).base
    return sid if base is None else base
