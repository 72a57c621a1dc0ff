"""The room a runner gives each pointer of a kernel call: C++ kernels (format >= 17) and
Triton kernels (format >= 19).

A kernel that takes the room (codegen/cpp/room.py: its library's table says so) compares, before
it touches memory, the elements each pointer has up to the end of its storage with the extent it
was compiled to index, and refuses the call (returns -1 - i) on a shortfall: a plan whose slot is
smaller than its kernel's buffer (damaged or hostile) then raises the ArtifactError built here
instead of letting the kernel write past an allocation. The Python runner knows each buffer's
room without looking at it: a buffer made from a slot (empty, empty_strided, a donor's view,
as_strided, `layout`) spans at least the slot's layout, which torch checked when it made it;
a tensor bound at load (a weight, a folded value, a generator's state) is measured once.

A Triton kernel (a CUDA artifact's) cannot refuse a call itself: its launch spec says how many
elements it indexes past each pointer (`extents`, artifact/schema/launch.py) and the runner
compares them with the same rooms before it launches (`check_room`): at load where both are
known then, else once per sizes seen (`extent_check_lines`).
"""
from __future__ import annotations

import ctypes
import re

import torch

from aotc.errors import ArtifactError


def tensor_room(t: torch.Tensor) -> int:
    """The elements from `t`'s first one to the end of its storage."""
    return max(0, t.untyped_storage().nbytes() // t.element_size() - t.storage_offset())


def span(shape, stride) -> int:
    """The elements a layout spans: one past its last element's offset (0 if it is empty)."""
    if any(d <= 0 for d in shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, stride))


def room_array(rooms: list[int]):
    """The array a kernel takes: the rooms, then as many entries it stores what it needed in."""
    return (ctypes.c_int64 * (2 * len(rooms)))(*rooms)


def keep_room(cache: dict, key: tuple, rooms):
    """`rooms`, kept in `cache` for the sizes `key` (a plan with dynamic shapes makes each
    kernel's room array once per sizes seen; at most 1024 of them are kept)."""
    if len(cache) >= 1024:
        cache.clear()
    cache[key] = rooms
    return rooms


def room_error(plan, step_index: int, code: int, rooms) -> ArtifactError:
    """The error for a kernel of plan step `step_index` that returned `code` (-1 - i: pointer
    `i` had less room than it indexes) with room array `rooms`."""
    step = plan.steps[step_index]
    slots = [*step.args, *step.out]
    i = -1 - code
    if not 0 <= i < len(slots):
        return ArtifactError(f"kernel {step.name} returned {code}, no code it defines",
                             where=f"plan step {step_index}", expected="0, an index error "
                             f"code or -1..-{len(slots)}", found=code, fix="re-export the model")
    slot = slots[i]
    role = "reads" if i < len(step.args) else "writes"
    return ArtifactError(f"kernel {step.name} {role} more of slot {slot} than the plan gives it",
                         where=f"plan step {step_index} (kernel {step.name}), slot {slot}",
                         expected=f"room for {rooms[len(slots) + i]} elements",
                         found=f"{rooms[i]} elements",
                         fix="re-export the model (the plan's slots disagree with its kernels)")


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= max(d, 0)
    return n


def slot_room(slot, source) -> int | str:
    """The room of a buffer the Python runner made from `slot` (a kernel's output, or a value
    laid out to the slot): an int when its dims are constants, else the Python source that
    computes it per call (`source` prints a dims tuple)."""
    dims = (*slot.shape, *slot.stride)
    if all(isinstance(d, int) for d in dims):
        return numel(slot.shape) if slot.contiguous else span(slot.shape, slot.stride)
    if slot.contiguous:   # the dims of a tensor that exists: none negative
        return " * ".join(f"({source((d,))[1:-2]})" for d in slot.shape) or "1"
    return f"room_span({source(slot.shape)}, {source(slot.stride)})"


def check_room(plan, step_index: int, rooms, needs) -> None:
    """Raise the ArtifactError of plan step `step_index` (a Triton kernel) if a pointer's room
    is less than the extent its kernel indexes."""
    for i, (room, need) in enumerate(zip(rooms, needs)):
        if need > room:
            raise room_error(plan, step_index, -1 - i, [*rooms, *needs])


def extent_check_lines(fn, plan, step_index: int, rooms: list, extents: tuple) -> list[str]:
    """The plan function's lines that check a Triton kernel call's rooms (ints, or sources
    over the call's sizes and tensors) against its launch spec's `extents` (size expressions):
    none, having checked now, when all are known at load; a check once per sizes seen where
    they depend on sizes alone; else a check per call (a replaceable parameter's room)."""
    from aotc.artifact.schema import expr as ex
    needs = [ex.evaluate(e, {}) if not ex.names(e) else ex.source(e) for e in extents]
    if all(isinstance(v, int) for v in (*rooms, *needs)):
        check_room(plan, step_index, rooms, needs)
        return []
    f, p = fn.bind(check_room, "check_room"), fn.bind(plan, "plan")
    call = (f"{f}({p}, {step_index}, ({', '.join(map(str, rooms))},), "
            f"({', '.join(map(str, needs))},))")
    if any("room_of(" in str(r) for r in rooms):
        return [f"    {call}"]
    sizes = sorted(set(re.findall(r"\bS_\w+", " ".join(map(str, (*rooms, *needs))))))
    seen = fn.bind({}, "roomseen")
    key = f"({', '.join(sizes)},)"
    return [f"    if {key} not in {seen}: {call}; keep_room({seen}, {key}, True)"]


def plan_extents(plans: dict, files: dict) -> dict:
    """{launch spec file: bytes} of an artifact written before format 19, its launch specs
    given the extents its export would have written: each kernel step's slots' layouts (a
    kernel's buffers are its slots), for an artifact rewritten in the current format."""
    import json

    from aotc.artifact import format as fmt
    from aotc.artifact.schema import expr as ex
    out = {}
    for plan in plans.values():
        for step in plan.steps:
            launch = getattr(step, "launch", None)   # (kernel steps; Triton ones have it)
            rel = fmt.triton_launch_file(step.name) if launch is not None else None
            if rel is None or rel not in files:
                continue
            doc = json.loads(files[rel])
            doc["extents"] = [_extent_text(plan.slots[s], ex) for s in (*step.args, *step.out)]
            out[rel] = fmt.dumps(doc)
    return out


def _extent_text(slot, ex) -> str:
    dims = (*slot.shape, *slot.stride)
    if all(isinstance(d, int) for d in dims):
        return str(span(slot.shape, slot.stride))
    text = [d if isinstance(d, int) else ex.text(d) for d in dims]
    n = len(slot.shape)
    if any(isinstance(d, int) and d <= 0 for d in slot.shape):
        return "0"
    empty = "".join(f"*min(1, {text[i]})" for i in range(n) if not isinstance(slot.shape[i], int))
    return "(1 + " + " + ".join(f"({text[i]} - 1)*({text[n + i]})" for i in range(n)) + ")" + empty
