"""The backend protocol: scheduled kernels in, kernel sources, binaries and the manifest's
`native` section out.

Both backends (`codegen/cpp/`: C++/OpenMP for CPUs, `codegen/triton/`: Triton for CUDA) implement
`Backend` with the same three steps, which the pass list (codegen/passes.py) runs in order:

    generate(groups)   each entry's kernels -> `GeneratedKernels`: source files, each kernel's
                       signature (the buffers it reads and writes, its size arguments, its
                       launch), and the backend's own build work; no compiler runs
    build(generated)   the compiler runs: {artifact path: bytes} of libraries or cubins and
                       launch specs
    native(generated)  the manifest's `target.native` section describing them

A backend also says how the graphs it compiles are lowered (`lowering`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, Sequence, runtime_checkable

from aotc.artifact.schema.plan import Launch
from aotc.codegen.target import Target


@dataclass(frozen=True, slots=True, kw_only=True)
class Lowering:
    """How graphs are lowered for a backend: the choices that were booleans of codegen."""
    codegen: bool = True             # False: every op stays an extern ATen call
    channels_last: bool = False      # 2d convolutions channels-last (oneDNN, cuDNN tensor cores)
    split_reductions: bool = False   # long reductions onto few outputs in two stages (GPUs)
    sdpa_layout: bool = False        # SDPA outputs where the CPU's attention puts them
    fuse_attention: bool = False     # hand-written attention -> one SDPA call


ATEN_ONLY = Lowering(codegen=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelGroup:
    """One entry's kernels with the buffers they index (name -> ir.Buffer) and the names of
    the buffers something outside their own kernel reads (`stored`)."""
    entry: str
    kernels: tuple
    buffers: dict
    stored: frozenset


class Signature(NamedTuple):
    """A generated kernel's calling convention: buffer names read, written, size expressions,
    and (Triton) its launch, typed: grid, launch spec file, error code."""
    inputs: list
    outputs: list
    sizes: list
    launch: Launch | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratedKernels:
    """What `Backend.generate` made: `sources` ({artifact path: bytes}, written as they are),
    `texts` (kernel name -> its source alone, for dumps and reports), `signatures` (kernel
    name -> Signature) and `work`, the backend's own input to `build` and `native`."""
    sources: dict = field(default_factory=dict)
    texts: dict = field(default_factory=dict)
    signatures: dict = field(default_factory=dict)
    work: object = None


NO_KERNELS = GeneratedKernels()


@runtime_checkable
class Backend(Protocol):
    name: str        # "cpp" or "triton"
    device: str      # the device its kernels run on

    def lowering(self, inference: bool) -> Lowering:
        """The lowering choices for this backend (`inference`: no training graphs)."""

    def generate(self, groups: Sequence[KernelGroup]) -> GeneratedKernels:
        """Kernel sources and signatures for every entry's kernels; no compiler runs."""

    def build(self, generated: GeneratedKernels) -> dict[str, bytes]:
        """Compile `generated`: {artifact path: bytes} of binaries (and launch specs)."""

    def native(self, generated: GeneratedKernels) -> dict:
        """The manifest's `target.native` section for the built kernels."""


def backend_for(target: Target, *, codegen: bool, isa: str = "auto", autotune: bool = False,
                hints: dict | None = None) -> Backend | None:
    """The backend that compiles for `target` (None: codegen off, an ATen-only plan).
    `hints`: the size symbols' example sizes and maxima ({"example": ..., "maximum": ...};
    Triton block sizes and 32-bit indexing); `autotune` times Triton block sizes on this
    machine's GPU."""
    if not codegen:
        return None
    if target.device == "cuda":
        from aotc.codegen.triton import TritonBackend
        return TritonBackend(list(target.archs), hints or {"example": {}, "maximum": {}},
                             autotune=autotune)
    from aotc.codegen.cpp import CppBackend
    return CppBackend(isa)
