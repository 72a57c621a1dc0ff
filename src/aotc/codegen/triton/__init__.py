"""The Triton backend: Kernels in, one Triton source, cubins and a launch spec per kernel out.

The twin of `codegen/cpp/`: the same IR and scheduler, kernels written as Triton instead of
C++ and compiled ahead of time, for each requested GPU arch, with no GPU needed:

    kernels/<name>.py            the kernel's source: self-contained, readable, and runnable
                                 as is under Triton's interpreter
    kernels/<name>.<arch>.cubin  the same compiled for <arch> (sm_80, sm_90, ...)
    kernels/<name>.json          launch spec: parameters in order, block sizes, grid over the
                                 plan's size symbols, the elements the kernel indexes past each
                                 pointer (`extents`, format >= 19), per arch symbol/shared
                                 memory/warps/scratch, and with --autotune what was timed and
                                 chosen (autotune.py)
"""
from __future__ import annotations

from pathlib import Path

from aotc.codegen.triton.build import arch_number, share_codes, triton_version, unique_builds
from aotc.codegen.triton.kernel import KernelSource, kernel_source
from aotc.codegen.triton.printer import extent
from aotc.exporter.symbols import SymbolNamer
from aotc.artifact import format as fmt

PRELUDE = (Path(__file__).parent / "prelude.py").read_text()

__all__ = ["generate", "module_text", "triton_version", "arch_number"]


def module_text(ks: KernelSource) -> str:
    """The complete, self-contained Python module of one kernel."""
    header = (f'"""aotc generated Triton kernel {ks.name}.\n\n'
              f"Launch: grid = ({', '.join(ks.grid)}), "
              f"{', '.join(f'{k}={v}' for k, v in ks.constexprs.items())}, "
              f"num_warps={ks.num_warps}; parameters: {', '.join(ks.signature)}; "
              "AOTC_PDL=True in sm_90+ builds.\n"
              "aotc's runtime launches the cubins compiled from this file (see the .json beside "
              "it);\nimported with TRITON_INTERPRET=1 it runs as is on CPU tensors.\n"
              '"""\n')
    return header + PRELUDE + "\n\n" + ks.text


def launch_spec(ks: KernelSource, buffers: dict) -> dict:
    """The arch-independent part of a kernel's launch spec. `extents`: for each buffer it
    reads, then each it writes, the elements from the pointer to one past the last the kernel
    may touch (the buffer's layout it was compiled for: a masked or proven index stays inside
    it), over the plan's size symbols; the runners refuse a call whose tensors have less room
    (runtime/room.py)."""
    name = SymbolNamer().expr
    extents = [name(_extent(buffers[n])) for n in (*ks.ins, *ks.outs)]
    return {"name": ks.name, "source": fmt.triton_source_file(ks.name),
            "inputs": ks.ins, "outputs": ks.outs, "extents": extents, "sizes": ks.sizes,
            "params": [{"name": n, "type": t} for n, t in ks.signature.items()],
            "constexprs": ks.constexprs, "grid": ks.grid, "num_warps": ks.num_warps,
            "error_code": ks.error_code, "triton": triton_version(), "archs": {}}


def _extent(buf):
    """The elements a buffer's layout spans: 0 where a dim is empty (a dynamic dim that may be
    is a factor min(1, dim), which the size grammar has)."""
    import sympy
    if any(d.is_Integer and int(d) <= 0 for d in map(sympy.sympify, buf.shape)):
        return sympy.Integer(0)
    empty = [sympy.Min(1, d) for d in map(sympy.sympify, buf.shape) if not d.is_Integer]
    return sympy.Mul(extent(buf), *empty)


def generate(kernels: list, buffers: dict, stored: set, archs: list[str], *,
             first_code: int = 1, tuner=None, hints=None) -> tuple[dict, dict]:
    """({artifact-relative path: bytes}, {kernel name: launch spec}) for `kernels`, compiled
    for each of `archs`. Kernels that index with runtime values get error codes from
    `first_code` on (one per kernel shape: `share_codes`). With a `tuner` (autotune.Tuner),
    each kernel is built with the block config it chose, and its launch spec records the
    tuning. `hints`: the size symbols' examples and maxima (blocks.SizeHints), for dynamic
    dims. Kernels of one shape (build.kernel_shape: the same text but for names) compile
    once."""
    tuned = tuner.tune(kernels, buffers, stored, first_code) if tuner is not None else {}
    files, specs, jobs, sources = {}, {}, [], []
    for i, k in enumerate(kernels):
        config = tuned.get(k.name, (None, None))[0]
        sources.append(k.source(buffers, first_code + i) if hasattr(k, "source") else
                       kernel_source(k, buffers, stored, first_code + i, config, hints))
    for k, ks in zip(kernels, share_codes(sources)):
        record = tuned.get(k.name, (None, None))[1]
        text = module_text(ks)
        specs[k.name] = launch_spec(ks, buffers)
        if record is not None:
            specs[k.name]["autotune"] = record
        files[fmt.triton_source_file(k.name)] = text.encode()
        jobs += [(ks, text, arch, ()) for arch in archs]
        if ks.aligned:   # a variant for when the sizes in addresses are divisible by 16
            jobs += [(ks, text, arch, ks.aligned) for arch in archs]
    for (ks, _, arch, aligned), (cubin, meta) in zip(jobs, unique_builds(jobs)):
        path = fmt.triton_cubin_file(ks.name, arch, "div16" if aligned else None)
        files[path] = cubin
        if aligned:
            specs[ks.name]["archs"][arch]["div16"] = dict(meta, cubin=path, sizes=list(aligned))
        else:
            specs[ks.name]["archs"][arch] = dict(meta, cubin=path)   # before its div16
    for name, spec in specs.items():
        files[fmt.triton_launch_file(name)] = fmt.dumps(spec)
    return files, specs
