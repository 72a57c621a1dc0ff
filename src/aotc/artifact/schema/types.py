"""The closed vocabularies of the artifact schema: step and slot kinds, dtypes, layouts.

Shared by codegen (which writes plans and manifests) and the runtime (which reads them); no torch
import, so the schema can be checked before torch objects are built.
"""
from __future__ import annotations

import re
from enum import Enum

from aotc.artifact.schema import expr as ex


class StepKind(str, Enum):
    KERNEL = "kernel"   # a generated, fused kernel from the artifact's native library
    EXTERN = "extern"   # an ATen op called through the dispatcher (vendor library or fallback)
    VIEW = "view"       # an ATen view op: no data moves; the result aliases its base slot
    FREE = "free"       # drop the plan's references to slots whose last use has passed


class SlotKind(str, Enum):
    INPUT = "input"
    WEIGHT = "weight"
    STATE = "state"     # a persistent tensor of the module that plans update (a KV cache)
    VALUE = "value"


class Device(str, Enum):
    CPU = "cpu"
    CUDA = "cuda"


DTYPE_SET = frozenset({"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16",
                       "int8", "uint8", "bool", "complex64", "complex128", "float8_e4m3fn",
                       "float8_e5m2"})
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
            "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
            "float8_e4m3fn": 1, "float8_e5m2": 1}
LAYOUT_SET = frozenset({"strided", "sparse_coo"})
MEMORY_FORMAT_SET = frozenset({"contiguous_format", "channels_last", "channels_last_3d",
                               "preserve_format"})
# names of weights and inputs: shown in messages and used as dictionary keys, never as code
WEIGHT_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,1024}\Z")
HEX64 = re.compile(r"[0-9a-f]{64}\Z")


def size_json(dims) -> list:
    """Sizes as plans and manifests store them: ints, or expression text."""
    return [d if isinstance(d, int) else ex.text(d) for d in dims]
