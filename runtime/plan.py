"""Plans: the closed vocabulary of plan steps, and the plan's JSON argument encoding.

A plan (plans/<entry>.json) lists slots (one per value: input, weight or intermediate, with its
symbolic shape and dtype) and ordered steps. Codegen writes plans with `encode_arg`; the runtime
reads them with `decode_arg`.
"""
from __future__ import annotations

import math
import re
from enum import Enum

import torch

from aotc.runtime.dtypes import DTYPES, DTYPE_NAMES, LAYOUTS, MEMORY_FORMATS


class StepKind(str, Enum):
    KERNEL = "kernel"   # a generated, fused kernel from the artifact's native library
    EXTERN = "extern"   # an ATen op called through the dispatcher (vendor library or fallback)
    VIEW = "view"       # an ATen view op: no data moves; the result aliases its base slot
    FREE = "free"       # drop the plan's references to slots whose last use has passed


class SlotKind(str, Enum):
    INPUT = "input"
    WEIGHT = "weight"
    VALUE = "value"


def slots_in(arg) -> list[int]:
    """The slots an encoded argument (or list of them) refers to."""
    if isinstance(arg, list):
        return [s for a in arg for s in slots_in(a)]
    if isinstance(arg, dict) and "slot" in arg:
        return [arg["slot"]]
    return []


def step_uses(step) -> list[int]:
    """The slots a plan step reads."""
    if step["kind"] == StepKind.KERNEL.value:
        return list(step["args"])
    return slots_in(step["args"]) + slots_in(list(step["kwargs"].values()))


def without_outputs(plan: dict, dropped: set[int]) -> dict:
    """A copy of `plan` whose outputs at the positions in `dropped` are None and that runs only
    the steps the other outputs need (a training backward whose callers want no input
    gradients). Kernels are kept whole (one that also writes a needed buffer runs as it is);
    frees of slots no kept step binds are left out, and a kept kernel whose recycled buffer
    (`reuse`) is no longer produced allocates its own."""
    outputs = [{"const": None} if i in dropped and "slot" in o else o
               for i, o in enumerate(plan["outputs"])]
    live = {o["slot"] for o in outputs if "slot" in o}
    kept = []
    for step in reversed(plan["steps"]):
        if step["kind"] != StepKind.FREE.value:
            if not live & {o for o in step["out"] if o is not None}:
                continue
            step = _masked(step, live)
            live |= set(step_uses(step))
        kept.append(step)
    kept.reverse()
    bound = set(plan["inputs"]) | {i for i, s in enumerate(plan["slots"])
                                   if s["kind"] == SlotKind.WEIGHT.value}
    steps = []
    for step in kept:
        step = dict(step)
        if step["kind"] == StepKind.FREE.value:
            step["slots"] = [s for s in step["slots"] if s in bound]
            step["donate"] = [s for s in step.get("donate", []) if s in bound]
            if not step["donate"]:
                del step["donate"]
            if step["slots"] or step.get("donate"):
                steps.append(step)
            continue
        if step.get("reuse"):
            step["reuse"] = {o: d for o, d in step["reuse"].items() if d in bound}
        bound |= {o for o in step["out"] if o is not None}
        steps.append(step)
    return dict(plan, outputs=outputs, steps=steps)


# backward ops that take an `output_mask` (the position of that argument): a result nobody
# reads is not computed at all (a first convolution's input gradient)
OUTPUT_MASKS = {"aten::convolution_backward.default": 10,
                "aten::native_layer_norm_backward.default": 7,
                "aten::native_group_norm_backward.default": 9}


def _masked(step: dict, live: set) -> dict:
    pos = OUTPUT_MASKS.get(step.get("op")) if step["kind"] == StepKind.EXTERN.value else None
    if pos is None or len(step["args"]) <= pos or not isinstance(step["args"][pos], list):
        return step
    mask = [bool(m) and o is not None and o in live
            for m, o in zip(step["args"][pos], step["out"])]
    if mask == list(step["args"][pos]):
        return step
    args = list(step["args"])
    args[pos] = mask
    return dict(step, args=args, out=[o if m else None for o, m in zip(step["out"], mask)])


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


_NAME = re.compile(r"\b([A-Za-z_]\w*)\b")


def sym_source(text: str) -> str:
    """Python source of a symbol expression inside a plan function, where each size symbol
    `name` is bound to the local `S_name`."""
    return _NAME.sub(lambda m: m[1] if m[1] in ("min", "max") else f"S_{m[1]}", str(text))


def decode_arg(value, slot_name, device: torch.device) -> str:
    """Python source for one encoded argument (the runtime emits plans as Python functions)."""
    if isinstance(value, list):
        return "[" + ", ".join(decode_arg(v, slot_name, device) for v in value) + "]"
    if not isinstance(value, dict):
        return repr(value)
    (tag, payload), = value.items()
    if tag == "slot":
        return slot_name(payload)
    if tag == "sym":
        return f"({sym_source(payload)})"
    if tag == "float":
        return f"float({payload!r})"
    if tag == "dtype":
        DTYPES[payload]  # validate
        return f"torch.{payload}"
    if tag == "device":
        return "DEVICE"  # plans are placed on the device the artifact is loaded on
    if tag == "layout":
        LAYOUTS[payload]
        return f"torch.{payload}"
    if tag == "memory_format":
        MEMORY_FORMATS[payload]
        return f"torch.{payload}"
    raise ValueError(f"unknown argument tag {tag!r}")
