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
