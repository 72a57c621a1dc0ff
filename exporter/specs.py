"""Example-input specs: the `--example-input` mini-language.

    SPEC  := SHAPE [":" DTYPE [":" LO ".." HI]]
    SHAPE := DIM ("x" DIM)* | "scalar"
    DIM   := a positive integer

Examples: `8x3x224x224`, `8x128:int64`, `8x128:int64:0..30521`, `scalar:float64`. Integer inputs
are drawn uniformly from [LO, HI] (default 0..9, safe for any embedding table); floats from a
standard normal. The range is recorded so `aotc run` draws valid inputs too.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from aotc.errors import UsageError
from aotc.runtime.dtypes import ALIASES, DTYPES

_FIX = ("write the shape as sizes joined by 'x', optionally followed by ':dtype' and, for "
        "integer inputs, ':LO..HI', e.g. 8x3x224x224 or 8x128:int64:0..999")


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    values: tuple[int, int] | None = None   # inclusive range for integer inputs

    def make(self, generator: torch.Generator) -> torch.Tensor:
        if self.dtype.is_floating_point or self.dtype.is_complex:
            return torch.randn(self.shape, generator=generator).to(self.dtype)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, self.shape, generator=generator).bool()
        lo, hi = self.values or (0, 9)
        return torch.randint(lo, hi + 1, self.shape, generator=generator, dtype=self.dtype)


def parse_dtype(text: str, *, where: str) -> torch.dtype:
    name = ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in DTYPES:
        raise UsageError(f"unknown dtype {text!r} in {where}", where=where,
                         expected=", ".join(sorted(DTYPES)), found=text,
                         fix="use one of the listed dtype names, e.g. float32 or int64")
    return DTYPES[name]


def parse_input_spec(text: str) -> InputSpec:
    where = f"--example-input {text!r}"
    parts = text.strip().split(":")
    if not parts[0] or len(parts) > 3:
        raise UsageError(f"malformed example input {text!r}", where=where,
                         expected="SHAPE[:DTYPE[:LO..HI]]", found=text, fix=_FIX)
    shape = _parse_shape(parts[0], where)
    dtype = parse_dtype(parts[1], where=where) if len(parts) > 1 else torch.float32
    values = _parse_range(parts[2], where) if len(parts) > 2 else None
    if values is not None and (dtype.is_floating_point or dtype == torch.bool):
        raise UsageError(f"a value range only applies to integer inputs ({where})", where=where,
                         expected="an integer dtype with LO..HI", found=str(dtype), fix=_FIX)
    return InputSpec(shape=shape, dtype=dtype, values=values)


def _parse_shape(text: str, where: str) -> tuple[int, ...]:
    if text.strip().lower() == "scalar":
        return ()
    dims = text.lower().split("x")
    if not all(re.fullmatch(r"\s*\d+\s*", d) for d in dims):
        raise UsageError(f"malformed shape {text!r}", where=where,
                         expected="positive integers joined by 'x'", found=text, fix=_FIX)
    shape = tuple(int(d) for d in dims)
    if any(d == 0 for d in shape):
        raise UsageError(f"shape {text!r} has a zero-sized dim", where=where,
                         expected="sizes >= 1", found=text, fix="give every dim a size of 1 or more")
    return shape


def _parse_range(text: str, where: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*", text)
    if not m or int(m[1]) > int(m[2]):
        raise UsageError(f"malformed value range {text!r}", where=where,
                         expected="LO..HI with LO <= HI, e.g. 0..999", found=text, fix=_FIX)
    return int(m[1]), int(m[2])


def make_inputs(specs: list[InputSpec], seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(s.make(gen) for s in specs)
