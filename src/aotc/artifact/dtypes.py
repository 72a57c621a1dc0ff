"""Names of dtypes and other torch enums as they appear in manifests and plans."""
from __future__ import annotations

import torch

DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16",
           "bf16": "bfloat16", "fp64": "float64", "double": "float64", "long": "int64",
           "int": "int32"}

MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format,
                  "channels_last": torch.channels_last,
                  "channels_last_3d": torch.channels_last_3d,
                  "preserve_format": torch.preserve_format}
LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES[dtype]
