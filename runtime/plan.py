"""Plans: the closed vocabulary of plan steps, and the plan's JSON argument encoding.

A plan (plans/<entry>.json) lists slots (one per value: input, weight or intermediate, with its
symbolic shape and dtype) and ordered steps. Codegen writes plans with `encode_arg`; the runtime
reads them with `decode_arg`.
"""
from __future__ import annotations

import math
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


_LAYOUT_NAMES = {v: k for k, v in LAYOUTS.items()}
_FORMAT_NAMES = {v: k for k, v in MEMORY_FORMATS.items()}


def encode_arg(value, slot_of):
    """JSON form of one op argument; `slot_of(node)` maps a graph value to its slot number."""
    if isinstance(value, (list, tuple)):
        return [encode_arg(v, slot_of) for v in value]
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
    return {"slot": slot_of(value)}


def decode_arg(value, slot_name, device: torch.device) -> str:
    """Python source for one encoded argument (the runtime emits plans as Python functions)."""
    if isinstance(value, list):
        return "[" + ", ".join(decode_arg(v, slot_name, device) for v in value) + "]"
    if not isinstance(value, dict):
        return repr(value)
    (tag, payload), = value.items()
    if tag == "slot":
        return slot_name(payload)
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
