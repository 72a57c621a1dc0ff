"""Plan finishing: lowered steps in, a launch plan (plans/<entry>.json) out.

Buffer lifetimes are planned here: after the last use of a value (or an input) a FREE step
drops it, and multi-output results nobody reads are never bound. Kernel outputs reuse the storage of dead
buffers of the same byte size (memory planning). The planner also simulates the plan to report
the peak of live intermediate bytes.
"""
from __future__ import annotations

from collections import Counter

import torch

from aotc.artifact.dtypes import DTYPES
from aotc.artifact.schema import expr as ex
from aotc.artifact.encoding import SlotKind, StepKind, slots_in, step_uses  # noqa: F401 - re-exported


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


def finalize(slots: list, steps: list, inputs: list, outputs: list, entry: str,
             bindings: dict | None = None) -> dict:
    """Frees, buffer reuse and statistics. Symbolic sizes are measured at `bindings` (the
    declared maxima) for the memory statistics."""
    outs = {o["slot"] for o in outputs if "slot" in o}
    last_use = {}
    for idx, step in enumerate(steps):
        for pos, _ in step.get("binds", {}).values():   # a result read for its size: kept
            last_use[step["out"][pos]] = idx
        for s in step_uses(step):
            last_use[s] = idx
    for step in steps:   # views keep their base alive as long as they live
        if step["kind"] == StepKind.VIEW.value:
            base = slots_in(step["args"])[0]
            for o in step["out"]:
                if o is not None:
                    slots[o]["base"] = slots[base].get("base", base)
    final = []
    for idx, step in enumerate(steps):
        step = dict(step)
        if step["kind"] != StepKind.KERNEL.value:
            step["out"] = [o if (o in last_use or o in outs) else None for o in step["out"]]
        final.append(step)
        # inputs too: a caller that hands its inputs over (runtime/executor.py: a list the
        # plan empties, as a training backward does with what forward saved) frees each one
        # after its last read
        dead = sorted(s for s, last in last_use.items() if last == idx and s not in outs
                      and slots[s]["kind"] in (SlotKind.VALUE.value, SlotKind.INPUT.value))
        if dead:
            final.append({"kind": StepKind.FREE.value, "slots": dead})
    plan = {"entry": entry, "slots": slots, "inputs": inputs, "steps": final, "outputs": outputs}
    plan["stats"] = plan_stats(plan, bindings)
    plan["stats"]["peak_bytes_without_reuse"] = plan["stats"]["peak_bytes"]
    plan_reuse(plan)
    plan["stats"]["peak_bytes"] = plan_stats(plan, bindings)["peak_bytes"]
    return plan


def plan_reuse(plan: dict) -> None:
    """Let kernel outputs take over the storage of dead kernel buffers of the same dtype and
    size. A buffer is dead at the FREE step that drops it together with its last live view; that
    FREE step then keeps it bound (`donate`) and the kernel step names it (`reuse`)."""
    slots, steps = plan["slots"], plan["steps"]
    takers: dict[tuple, list] = {}
    views: dict[int, set] = {}
    for idx, step in enumerate(steps):
        if step["kind"] == StepKind.KERNEL.value:
            for o in step["out"]:
                takers.setdefault(_key(slots[o]), []).append((idx, o))
        for o in step.get("out") or []:
            if o is not None and slots[o].get("base") is not None:
                views.setdefault(slots[o]["base"], set()).add(o)
    taken, freed = set(), set()
    for idx, step in enumerate(steps):
        if step["kind"] != StepKind.FREE.value:
            continue
        freed |= set(step["slots"])
        for s in list(step["slots"]):
            slot = slots[s]
            if slot.get("producer") != "kernel" or not views.get(s, set()) <= freed \
                    or _key(slot) is None:
                continue
            taker = next(((i, o) for i, o in takers.get(_key(slot), [])
                          if i > idx and o not in taken), None)
            if taker is None:
                continue
            taken.add(taker[1])
            step["slots"].remove(s)
            step.setdefault("donate", []).append(s)
            steps[taker[0]].setdefault("reuse", {})[str(taker[1])] = s
    plan["steps"] = [s for s in steps if s["kind"] != StepKind.FREE.value
                     or s["slots"] or s.get("donate")]


def _key(slot):
    if "shape" not in slot or not all(isinstance(d, int) for d in slot["shape"]):
        return None
    return slot["dtype"], nbytes(slot)


def nbytes(slot, bindings: dict | None = None) -> int:
    if "shape" not in slot:
        return 0
    n = DTYPES[slot["dtype"]].itemsize
    for d in slot["shape"]:
        if not isinstance(d, int):
            if bindings is None:
                return 0
            d = ex.evaluate(ex.parse_size(d), bindings)
        n *= d
    return n


def plan_stats(plan: dict, bindings: dict | None = None) -> dict:
    """Step counts, op counts and the peak of live intermediate bytes (views share storage)."""
    slots = plan["slots"]
    live: dict[int, set] = {}          # storage root -> live slots viewing it
    cur = peak = 0
    reused = set()
    for step in plan["steps"]:
        reused |= {int(o) for o in step.get("reuse", {})}
        if step["kind"] == StepKind.FREE.value:
            for s in step["slots"]:
                root = slots[s].get("base", s)
                live.get(root, set()).discard(s)
                if root in live and not live[root]:
                    del live[root]
                    cur -= nbytes(slots[root], bindings)
            continue
        for o in step["out"]:
            if o is None:
                continue
            root = slots[o].get("base", o)
            if slots[root]["kind"] != SlotKind.VALUE.value:
                continue
            if root not in live:
                live[root] = set()
                cur += 0 if o in reused else nbytes(slots[root], bindings)
            live[root].add(o)
        peak = max(peak, cur)
    kinds = Counter(s["kind"] for s in plan["steps"])
    ops = Counter(s["op"] for s in plan["steps"] if "op" in s)
    return {"steps": dict(sorted(kinds.items())), "ops": dict(sorted(ops.items())),
            "peak_bytes": peak}
