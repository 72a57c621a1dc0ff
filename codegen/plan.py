"""Plan building: a Program's graph in, a launch plan (plans/<entry>.json) out.

Every node becomes a step: a VIEW when its ATen schema says the result aliases an argument (no
data moves), else an EXTERN call. Buffer lifetimes are planned here: after the last use of a
value a FREE step drops it, and multi-output results nobody reads are never bound. The planner
also simulates the plan to report its peak of live intermediate bytes.
"""
from __future__ import annotations

from collections import Counter

from aotc.runtime.dtypes import DTYPES
from aotc.runtime.executor import resolve_op
from aotc.runtime.plan import SlotKind, StepKind


def _slots_in(arg) -> list[int]:
    if isinstance(arg, list):
        return [s for a in arg for s in _slots_in(a)]
    if isinstance(arg, dict) and "slot" in arg:
        return [arg["slot"]]
    return []


def _node_uses(node) -> list[int]:
    return _slots_in(node["args"]) + _slots_in(list(node["kwargs"].values()))


def is_view(op) -> bool:
    ret = op._schema.returns
    return bool(ret) and ret[0].alias_info is not None and not ret[0].alias_info.is_write


def build_plan(graph: dict, entry: str = "forward") -> dict:
    values, nodes = graph["values"], graph["nodes"]
    kinds = {i["value"]: i for i in graph["inputs"]}
    outputs = {o["slot"] for o in graph["outputs"] if "slot" in o}
    last_use = {}
    for idx, node in enumerate(nodes):
        for s in _node_uses(node):
            last_use[s] = idx
    slots = [_slot(i, meta, kinds.get(i)) for i, meta in enumerate(values)]
    steps = []
    for idx, node in enumerate(nodes):
        op = resolve_op(node["op"])
        kind = StepKind.VIEW if is_view(op) else StepKind.EXTERN
        out = [o if (o in last_use or o in outputs) else None for o in node["out"]]
        if kind == StepKind.VIEW:
            base = _slots_in(node["args"])[0]
            for o in out:
                if o is not None:
                    slots[o]["base"] = slots[base].get("base", base)
        steps.append({"kind": kind.value, "op": node["op"], "args": node["args"],
                      "kwargs": node["kwargs"], "out": out, "single": node["single"]})
        dead = sorted(s for s, last in last_use.items() if last == idx and s not in outputs
                      and slots[s]["kind"] == SlotKind.VALUE.value)
        if dead:
            steps.append({"kind": StepKind.FREE.value, "slots": dead})
    plan = {"entry": entry, "slots": slots, "inputs": [i["value"] for i in graph["inputs"]
                                                       if i["kind"] == "input"],
            "steps": steps, "outputs": graph["outputs"]}
    plan["stats"] = plan_stats(plan)
    return plan


def _slot(i: int, meta, inp) -> dict:
    slot = {"id": i, "kind": SlotKind.VALUE.value}
    if inp is not None:
        slot["kind"] = SlotKind.WEIGHT.value if inp["kind"] == "weight" else SlotKind.INPUT.value
        slot["weight" if inp["kind"] == "weight" else "name"] = inp["name"]
    if meta and "shape" in meta:
        slot.update(shape=meta["shape"], dtype=meta["dtype"])
    return slot


def _nbytes(slot) -> int:
    if "shape" not in slot or not all(isinstance(d, int) for d in slot["shape"]):
        return 0
    n = DTYPES[slot["dtype"]].itemsize
    for d in slot["shape"]:
        n *= d
    return n


def plan_stats(plan: dict) -> dict:
    """Step counts, ATen op counts and the peak of live intermediate bytes (views share storage)."""
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
                    cur -= _nbytes(slots[root])
            continue
        for o in step["out"]:
            if o is None:
                continue
            root = slots[o].get("base", o)
            if slots[root]["kind"] != SlotKind.VALUE.value:
                continue
            if root not in live:
                live[root] = set()
                cur += _nbytes(slots[root])
            live[root].add(o)
        peak = max(peak, cur)
    kinds = Counter(s["kind"] for s in plan["steps"])
    ops = Counter(s["op"] for s in plan["steps"] if "op" in s)
    return {"steps": dict(sorted(kinds.items())), "ops": dict(sorted(ops.items())),
            "peak_bytes": peak}
