"""safetensors files read from verified memory, without copying and without trusting the header.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the raw data. The header is checked before any tensor is made:
its length fits the file, dtypes come from the fixed table, shapes are non-negative integers,
each byte range lies inside the data, is exactly as long as its shape and dtype say, and no two
overlap. Tensors are views of the buffer they are given (a private memory mapping of the
weights, or the bytes of a sample file), so a caller that writes to one never changes a file.
"""
from __future__ import annotations

import json
import struct

import torch

from aotc.errors import ArtifactError

_CODES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool, "C64": torch.complex64,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
CODES = {dtype: code for code, dtype in _CODES.items()}     # what a writer records
MAX_HEADER = 100 << 20
MAX_DIMS = 16


def _bad(file: str, what: str, expected, found) -> ArtifactError:
    return ArtifactError(f"{file} has a damaged header: {what}", where=file, expected=expected,
                         found=found, fix="re-export the model (the weights file was damaged or "
                                          "not written by aotc)")


def read_header(buf, file: str, total: int | None = None) -> tuple[int, dict]:
    """(offset of the data, {name: (dtype, shape, start, end)}) of a safetensors buffer; `total`:
    the file's size, where `buf` holds only its start (a shard streamed in chunks)."""
    total = len(buf) if total is None else total
    if total < 8 or len(buf) < 8:
        raise _bad(file, "too short", "an 8-byte header length", f"{total} bytes")
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    if n > min(MAX_HEADER, total - 8):
        raise _bad(file, "header length past the end", f"at most {min(MAX_HEADER, total - 8)}",
                   n)
    if 8 + n > len(buf):
        raise _bad(file, "header longer than the bytes read", f"at most {len(buf) - 8}", n)
    try:
        header = json.loads(bytes(buf[8:8 + n]))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(file, f"not JSON ({str(e)[:80]})", "a JSON header", "unparsable bytes") \
            from None
    if not isinstance(header, dict):
        raise _bad(file, "not an object", "a JSON object", type(header).__name__)
    header.pop("__metadata__", None)
    data = total - 8 - n
    out = {name: _entry(name, info, data, file) for name, info in header.items()}
    spans = sorted((lo, hi, name) for name, (_, _, lo, hi) in out.items() if hi > lo)
    for (lo1, hi1, a), (lo2, _, b) in zip(spans, spans[1:]):
        if lo2 < hi1:
            raise _bad(file, f"tensors {a!r} and {b!r} overlap", "disjoint byte ranges",
                       f"[{lo1}, {hi1}) and [{lo2}, ...)")
    return 8 + n, out


def _entry(name: str, info, data: int, file: str):
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _bad(file, f"entry {name!r} is malformed", "dtype, shape and data_offsets",
                   str(info)[:80])
    dtype = _CODES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    shape, offsets = info["shape"], info["data_offsets"]
    if dtype is None:
        raise _bad(file, f"entry {name!r} has an unknown dtype", sorted(_CODES), info["dtype"])
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
            and all(type(d) is int and 0 <= d < 1 << 48 for d in shape)):
        raise _bad(file, f"entry {name!r} has a bad shape", "non-negative integers", shape)
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1] <= data):
        raise _bad(file, f"entry {name!r} has bad offsets", f"0 <= begin <= end <= {data}",
                   offsets)
    numel = 1
    for d in shape:
        numel *= d
    if offsets[1] - offsets[0] != numel * dtype.itemsize:
        raise _bad(file, f"entry {name!r} has the wrong byte length",
                   f"{numel * dtype.itemsize} bytes for {info['dtype']}{shape}",
                   f"{offsets[1] - offsets[0]} bytes")
    return dtype, tuple(shape), offsets[0], offsets[1]


def tensors(buf, file: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors buffer (an mmap or bytes), as views of it (a copy only for
    a tensor whose bytes are not aligned for its dtype)."""
    start, header = read_header(buf, file)
    if isinstance(buf, bytes):   # samples: small; tensors of a writable copy
        buf = bytearray(buf)
    raw = torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)
    out = {}
    for name, (dtype, shape, lo, hi) in header.items():
        chunk = raw[start + lo:start + hi]
        if (start + lo) % dtype.itemsize:
            chunk = chunk.clone()
        out[name] = chunk.view(dtype).reshape(shape)
    return out
