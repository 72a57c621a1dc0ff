"""Plan finishing: lowered steps in, a launch plan (plans/<entry>.json) out.

Buffer lifetimes are planned here: after the last use of a value a FREE step drops it, and
multi-output results nobody reads are never bound. Kernel outputs reuse the storage of dead
buffers of the same byte size (memory planning). The planner also simulates the plan to report
the peak of live intermediate bytes.
"""
from __future__ import annotations

from collections import Counter

from aotc.runtime.dtypes import DTYPES
from aotc.runtime.plan import SlotKind, StepKind


def slots_in(arg) -> list[int]:
    if isinstance(arg, list):
        return [s for a in arg for s in slots_in(a)]
    if isinstance(arg, dict) and "slot" in arg:
        return [arg["slot"]]
    return []


def step_uses(step) -> list[int]:
    if step["kind"] == StepKind.KERNEL.value:
        return list(step["args"])
    return slots_in(step["args"]) + slots_in(list(step["kwargs"].values()))


def is_view(op) -> bool:
    ret = op._schema.returns
    return bool(ret) and ret[0].alias_info is not None and not ret[0].alias_info.is_write


def finalize(slots: list, steps: list, inputs: list, outputs: list, entry: str) -> dict:
    outs = {o["slot"] for o in outputs if "slot" in o}
    last_use = {}
    for idx, step in enumerate(steps):
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
        dead = sorted(s for s, last in last_use.items() if last == idx and s not in outs
                      and slots[s]["kind"] == SlotKind.VALUE.value)
        if dead:
            final.append({"kind": StepKind.FREE.value, "slots": dead})
    plan = {"entry": entry, "slots": slots, "inputs": inputs, "steps": final, "outputs": outputs}
    plan["stats"] = plan_stats(plan)
    return plan


def nbytes(slot) -> int:
    if "shape" not in slot or not all(isinstance(d, int) for d in slot["shape"]):
        return 0
    n = DTYPES[slot["dtype"]].itemsize
    for d in slot["shape"]:
        n *= d
    return n


def plan_stats(plan: dict) -> dict:
    """Step counts, op counts and the peak of live intermediate bytes (views share storage)."""
    slots = plan["slots"]
    live: dict[int, set] = {}          # storage root -> live slots viewing it
    cur = peak = 0
    for step in plan["steps"]:
        if step["kind"] == StepKind.FREE.value:
            for s in step["slots"]:
                root = slots[s].get("base", s)
                live.get(root, set()).discard(s)
                if root in live and not live[root]:
                    del live[root]
                    cur -= nbytes(slots[root])
            continue
        for o in step["out"]:
            if o is None:
                continue
            root = slots[o].get("base", o)
            if slots[root]["kind"] != SlotKind.VALUE.value:
                continue
            if root not in live:
                live[root] = set()
                cur += nbytes(slots[root])
            live[root].add(o)
        peak = max(peak, cur)
    kinds = Counter(s["kind"] for s in plan["steps"])
    ops = Counter(s["op"] for s in plan["steps"] if "op" in s)
    return {"steps": dict(sorted(kinds.items())), "ops": dict(sorted(ops.items())),
            "peak_bytes": peak}
