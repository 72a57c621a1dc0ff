"""The launch spec of one Triton kernel of a CUDA artifact (kernels/<name>.json), typed.

Written at export (codegen/triton): the kernel's parameters in order (buffers read, buffers
written, `aotc_err` when it indexes with runtime values, dim sizes), its block sizes, the grid
as expressions over the plan's size symbols, the elements it indexes past each buffer's pointer
(`extents`, format >= 19: what the runners check each call's tensors against), and per arch the cubin with its entry symbol,
shared memory, warps and the scratch parameters Triton appends. Every file it names is the
one the format names for this kernel and arch, so a spec cannot point anywhere else.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from aotc.artifact.schema.fields import At
from aotc.artifact.schema.manifest import ARCH, display
from aotc.artifact.schema.rules import MAX_KERNEL_BUFFERS

BLOCK_NAME = re.compile(r"(?:XBLOCK|R\d{1,2}_BLOCK)\Z")   # generated kernels' block sizes
BLOCK_NODES = 100         # R<n>_BLOCK is the block of a kernel's node n: n has two digits
PARAM_TYPE = re.compile(r"\*(?:fp8e4nv|fp8e5|fp64|fp32|fp16|bf16|i64|i32|i16|i8|u8|i1)\Z|i32\Z|i64\Z")
WARPS = frozenset({1, 2, 4, 8, 16, 32})
MAX_SHARED = 256 * 1024
# A kernel's block sizes (XBLOCK, and one R<n>_BLOCK per reduction it fuses) and its dim-size
# parameters: the scheduler fuses no more reductions into one kernel than these take
# (codegen/scheduler.py), and codegen checks each spec against them as it writes it.
MAX_BLOCKS = 64
MAX_SIZES = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    name: str
    type: str                 # "*fp32", "i32", ... or "scratch"
    bytes: int = 0            # scratch: bytes per program
    align: int = 1            # scratch: alignment

    def to_json(self) -> dict:
        out = {"name": self.name, "type": self.type}
        if self.type == "scratch":
            out.update(bytes=self.bytes, align=self.align)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Build:
    """One compiled cubin of a kernel."""
    cubin: str
    symbol: str
    shared: int
    num_warps: int
    num_ctas: int
    params: tuple
    sizes: tuple = ()         # div16 builds: the size parameters declared divisible by 16
    pdl: bool = False         # built to wait on its predecessor (format >= 11): launched with
                              # programmatic stream serialization


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    name: str
    params: tuple             # Param (user parameters, no scratch)
    inputs: tuple
    outputs: tuple
    sizes: tuple
    constexprs: dict
    grid: tuple
    error_code: int | None
    archs: dict               # arch -> (Build, div16 Build | None)
    autotune: dict | None = None
    extents: tuple = ()       # per input, then output: elements indexed (format >= 19; else
                              # empty: the kernel's buffers unchecked)


def cubin_file(kernel: str, arch: str, variant: str | None = None) -> str:
    return f"kernels/{kernel}.{arch}{'.' + variant if variant else ''}.cubin"


EXTENTS_SINCE = 19


def parse_launch(doc: At, name: str, symbols, version: int = EXTENTS_SINCE) -> LaunchSpec:
    """The launch spec of kernel `name` in an artifact of format `version` (its `extents` are
    required from EXTENTS_SINCE: a spec without them would run its kernel unchecked)."""
    extents = ("extents",) if version >= EXTENTS_SINCE else ()
    doc.obj(required=("name", "source", "params", "inputs", "outputs", "sizes", "constexprs",
                      "num_warps", "grid", "error_code", "triton", "archs", *extents),
            optional=("autotune",))
    doc.get("name").str(choices={name})
    doc.get("source").str(choices={f"kernels/{name}.py"})
    params = tuple(_param(p, scratch=False) for p in doc.get("params").list(MAX_KERNEL_BUFFERS))
    pnames = {p.name for p in params}
    io = {k: tuple(x.ident() for x in doc.get(k).list(MAX_KERNEL_BUFFERS)) for k in ("inputs", "outputs")}
    for k, names in io.items():
        doc.get(k).check(set(names) <= pnames, "names of the kernel's parameters")
    code = doc.get("error_code")
    archs = {}
    for arch, a in doc.get("archs").items(16):
        a.check(bool(ARCH.match(arch)), "a GPU arch name (sm_XX)", "is not an arch")
        div16 = _build(a.get("div16"), cubin_file(name, arch, "div16"), div16=True) \
            if a.has("div16") else None
        archs[arch] = (_build(a, cubin_file(name, arch), div16=False, extra=("div16",)), div16)
    at = doc.get("autotune", None)
    n = len(io["inputs"]) + len(io["outputs"])
    return LaunchSpec(
        extents=tuple(e.expr(symbols) for e in doc.get("extents").list(n, n)) if extents else (),
        name=name, params=params, inputs=io["inputs"], outputs=io["outputs"],
        sizes=tuple(s.ident() for s in doc.get("sizes").list(MAX_SIZES)),
        constexprs={k: _block(k, v) for k, v in doc.get("constexprs").items(MAX_BLOCKS)},
        grid=tuple(g.expr(symbols) for g in doc.get("grid").list(3, 3)),
        error_code=None if code.is_null() else code.int(1, 1 << 30), archs=archs,
        autotune=None if at.is_null() else display(at))


def _block(name: str, v: At) -> int:
    """A constexpr of a generated kernel: a block size, a power of two (Triton's blocks are;
    Triton's interpreter runs the source with these values, a cubin was built with them)."""
    v.check(bool(BLOCK_NAME.match(name)), "a block size named XBLOCK or R<n>_BLOCK",
            "is not a block size")
    n = v.int(1, 1 << 20)            # Triton's largest block (TRITON_MAX_TENSOR_NUMEL)
    v.check(n & (n - 1) == 0, "a power of two", f"is {n}")
    return n


def _param(p: At, scratch: bool) -> Param:
    if scratch and p.get("type").value == "scratch":
        p.obj(required=("name", "type", "bytes", "align"))
        align = p.get("align").int(1, 4096)
        p.get("align").check(align & (align - 1) == 0, "a power of two")
        return Param(name=p.get("name").ident(), type="scratch",
                     bytes=p.get("bytes").int(0, 1 << 30), align=align)
    p.obj(required=("name", "type"))
    return Param(name=p.get("name").ident(), type=p.get("type").str(pattern=PARAM_TYPE))


def _build(a: At, cubin: str, *, div16: bool, extra=()) -> Build:
    a.obj(required=("cubin", "symbol", "shared", "num_warps", "params"),
          optional=("num_ctas", "pdl", *(("sizes",) if div16 else ()), *extra))
    a.get("cubin").str(choices={cubin})
    warps = a.get("num_warps").int(1, 32)
    a.get("num_warps").check(warps in WARPS, f"one of {sorted(WARPS)}")
    return Build(cubin=cubin, symbol=a.get("symbol").ident(),
                 shared=a.get("shared").int(0, MAX_SHARED), num_warps=warps,
                 num_ctas=a.get("num_ctas", 1).int(1, 16),
                 params=tuple(_param(p, scratch=True) for p in a.get("params").list(MAX_KERNEL_BUFFERS)),
                 sizes=tuple(s.ident() for s in a.get("sizes", []).list(MAX_SIZES)),
                 pdl=a.get("pdl", False).bool())
