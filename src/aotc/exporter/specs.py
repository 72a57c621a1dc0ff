"""Example-input specs: the `--example-input` mini-language.

    SPEC  := SHAPE [":" DTYPE [":" LO ".." HI]]
    SHAPE := DIM ("x" DIM)* | "scalar"
    DIM   := SIZE                       a static size, e.g. 128
           | NAME "=" SIZE ["[" MIN ".." MAX "]"]
                                        a dynamic dim: example size and allowed range,
                                        e.g. batch=8[1..64] (default range 1..65536)
           | NAME                       the dim named earlier (same size), e.g. batch

Examples: `8x3x224x224`, `batch=8[1..64]x3x224x224`, `batch=4[1..32]xseq=128[8..512]:int64:0..999`,
then `batchxseq:int64:0..1` for a mask of the same shape. Integer inputs are drawn uniformly from
[LO, HI] (default 0..9, safe for any embedding table); floats from a standard normal. The value
range is recorded so `aotc run` draws valid inputs too. A dynamic dim needs an example size of
at least 2 (torch.export specializes sizes 0 and 1), though its range may include 1.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

from aotc.errors import UsageError
from aotc.artifact.dtypes import ALIASES, DTYPES

_FIX = ("write the shape as sizes joined by 'x' (a dynamic dim as name=size[min..max]), "
        "optionally followed by ':dtype' and, for integer inputs, ':LO..HI', e.g. "
        "batch=8[1..64]x3x224x224 or 8x128:int64:0..999")
DEFAULT_MAX = 65536


@dataclass(frozen=True, slots=True, kw_only=True)
class DynamicDim:
    name: str
    size: int
    min: int = 1
    max: int = DEFAULT_MAX


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSpec:
    dims: tuple            # int (static) or DynamicDim, per dim
    dtype: torch.dtype = torch.float32
    values: tuple[int, int] | None = None   # inclusive range for integer inputs

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else d.size for d in self.dims)

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


def parse_input_spec(text: str, named: dict | None = None) -> InputSpec:
    """Parse one spec. `named` maps dim names declared by earlier specs to their DynamicDim."""
    where = f"--example-input {text!r}"
    named = {} if named is None else named
    parts = text.strip().split(":")
    if not parts[0] or len(parts) > 3:
        raise UsageError(f"malformed example input {text!r}", where=where,
                         expected="SHAPE[:DTYPE[:LO..HI]]", found=text, fix=_FIX)
    dims = _parse_shape(parts[0], where, named)
    dtype = parse_dtype(parts[1], where=where) if len(parts) > 1 else torch.float32
    values = _parse_range(parts[2], where) if len(parts) > 2 else None
    if values is not None and (dtype.is_floating_point or dtype.is_complex or
                               dtype == torch.bool):
        raise UsageError(f"a value range only applies to integer inputs ({where})", where=where,
                         expected="an integer dtype with LO..HI", found=str(dtype), fix=_FIX)
    if values is not None:
        info = torch.iinfo(dtype)
        if values[0] < info.min or values[1] > info.max:
            raise UsageError(f"value range {values[0]}..{values[1]} does not fit {dtype} "
                             f"({where})", where=where, expected=f"{info.min}..{info.max}",
                             found=f"{values[0]}..{values[1]}",
                             fix="narrow the range or use a wider integer dtype (e.g. int64)")
    spec = InputSpec(dims=dims, dtype=dtype, values=values)
    _check_fits(spec, where)
    return spec


def _check_fits(spec: InputSpec, where: str) -> None:
    """A UsageError for an example input larger than this host's memory (100000x100000x100000
    would fail to allocate, or be killed, deep inside the export)."""
    size = spec.dtype.itemsize
    for d in spec.shape:
        size *= d
    memory = _host_memory()
    if memory is not None and size > memory:
        raise UsageError(f"example input {'x'.join(map(str, spec.shape))} of {spec.dtype} needs "
                         f"{size / 2**30:.4g} GiB, more than this host's memory "
                         f"({memory / 2**30:.4g} GiB)", where=where,
                         expected=f"at most {memory} bytes", found=f"{size} bytes",
                         fix="export with a small example size and make the dim dynamic "
                             "(name=SIZE[MIN..MAX]) so the artifact takes the large sizes")


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def parse_input_specs(texts) -> list[InputSpec]:
    named: dict = {}
    return [parse_input_spec(t, named) for t in texts]


def _parse_shape(text: str, where: str, named: dict) -> tuple:
    if text.strip().lower() == "scalar":
        return ()
    dims, pos, text = [], 0, text.strip()
    bad = lambda found: UsageError(f"malformed shape {text!r}", where=where,
                                   expected="sizes or name=size[min..max] joined by 'x'",
                                   found=found, fix=_FIX)
    while True:
        m = re.compile(r"\s*(\d+)\s*").match(text, pos)
        if m:
            if int(m[1]) == 0:
                raise UsageError(f"shape {text!r} has a zero-sized dim", where=where,
                                 expected="sizes >= 1", found=text,
                                 fix="give every dim a size of 1 or more")
            dims.append(int(m[1]))
            pos = m.end()
        else:
            dim, pos = _named_at(text, pos, where, named, bad)
            dims.append(dim)
        if pos == len(text):
            return tuple(dims)
        sep = re.compile(r"\s*x\s*").match(text, pos)
        if not sep or sep.end() == len(text):
            raise bad(text[pos:] or text)
        pos = sep.end()


def _named_at(text, pos, where, named, bad):
    """A named dim at `pos`: a reference to a declared name (longest match, so names may hold
    an 'x') or a declaration name=size[min..max]."""
    run = re.compile(r"[A-Za-z_]\w*").match(text, pos)
    if not run:
        raise bad(text[pos:] or text)
    decl = re.compile(r"\s*=\s*(\d+)(?:\s*\[\s*(\d+)\s*\.\.\s*(\d+)\s*\])?").match(text, run.end())
    refs = sorted((n for n in named if text.startswith(n, pos)), key=len, reverse=True)
    for name in refs:   # a declared name followed by the end or a separator
        rest = text[pos + len(name):]
        if not rest or re.match(r"\s*x", rest) and (decl is None or len(name) < len(run[0])):
            return named[name], pos + len(name)
    if decl is None:
        raise UsageError(f"dim {run[0]!r} is used before it is declared", where=where,
                         expected=f"{run[0]}=SIZE[MIN..MAX] in this or an earlier input",
                         found=run[0], fix=f"declare it, e.g. {run[0]}=8[1..64]")
    return _named_dim(run[0], decl[1], decl[2], decl[3], where, named), decl.end()


def _named_dim(name, size, lo, hi, where, named) -> DynamicDim:
    dim = DynamicDim(name=name, size=int(size), min=int(lo) if lo else 1,
                     max=int(hi) if hi else DEFAULT_MAX)
    if name in named and named[name] != dim:
        raise UsageError(f"dim {name!r} is declared twice with different sizes or ranges",
                         where=where, expected=str(named[name]), found=str(dim),
                         fix=f"declare {name} once and refer to it by name afterwards")
    if not dim.min <= dim.size <= dim.max:
        raise UsageError(f"dim {name}: example size {dim.size} is outside [{dim.min}, {dim.max}]",
                         where=where, expected=f"{dim.min} <= size <= {dim.max}", found=dim.size,
                         fix="choose an example size inside the range")
    if dim.size < 2:
        raise UsageError(f"dim {name}: a dynamic dim needs an example size of at least 2",
                         where=where, expected="example size >= 2", found=dim.size,
                         fix=f"write {name}=2[{dim.min}..{dim.max}]: torch.export specializes "
                             "sizes 0 and 1, but the range may still include 1")
    named[name] = dim
    return dim


def _parse_range(text: str, where: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*", text)
    if not m or int(m[1]) > int(m[2]):
        raise UsageError(f"malformed value range {text!r}", where=where,
                         expected="LO..HI with LO <= HI, e.g. 0..999", found=text, fix=_FIX)
    return int(m[1]), int(m[2])


def make_inputs(specs: list[InputSpec], seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(s.make(gen) for s in specs)


def dynamic_shapes(specs: list[InputSpec]):
    """torch.export `dynamic_shapes` for these specs (None when every dim is static)."""
    if not any(isinstance(d, DynamicDim) for s in specs for d in s.dims):
        return None
    dims: dict = {}
    out = []
    for s in specs:
        entry = {}
        for j, d in enumerate(s.dims):
            if isinstance(d, DynamicDim):
                if d.name not in dims:
                    dims[d.name] = torch.export.Dim(d.name, min=d.min, max=d.max)
                entry[j] = dims[d.name]
        out.append(entry or None)
    return tuple(out)
