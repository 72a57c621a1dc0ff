"""Memory-mapped weights: reads a safetensors file without copying it into process memory.

The file is mapped privately (copy-on-write), so tensors are views of the page cache and a
caller that writes to one never changes the file. The safetensors layout is parsed here directly
(an 8-byte header length, a JSON header, then the raw data) to keep loading zero-copy.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from aotc.errors import ArtifactError

_CODES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool, "C64": torch.complex64,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def read_header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ArtifactError(f"{path.name} is not a safetensors file", where=str(path),
                                expected="an 8-byte header length", found=f"{len(head)} bytes",
                                fix="re-export the model")
        (n,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ArtifactError(f"{path.name} has a damaged header ({e})", where=str(path),
                                expected="a JSON header", found="unparsable bytes",
                                fix="re-export the model") from None
    return 8 + n, header


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, as views of one private memory map."""
    path = Path(path)
    start, header = read_header(path)
    header.pop("__metadata__", None)
    nbytes = path.stat().st_size
    if nbytes == start:
        raw = torch.empty(0, dtype=torch.uint8)
    else:
        storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=nbytes)
        raw = torch.empty(0, dtype=torch.uint8).set_(storage)
    out = {}
    for name, info in header.items():
        dtype = _CODES[info["dtype"]]
        lo, hi = (start + o for o in info["data_offsets"])
        chunk = raw[lo:hi]
        if lo % dtype.itemsize:  # unaligned: copy rather than view
            chunk = chunk.clone()
        out[name] = chunk.view(dtype).reshape(info["shape"])
    return out
