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
from typing import Sequence

from aotc.codegen.backend import GeneratedKernels, KernelGroup, Lowering, Signature
from aotc.codegen.triton.build import arch_number, share_codes, triton_version, unique_builds
from aotc.codegen.triton.kernel import KernelSource, kernel_source
from aotc.codegen.triton.printer import extent
from aotc.exporter.symbols import SymbolNamer
from aotc.artifact import format as fmt
from aotc.artifact.builder import Launch, size
from aotc.errors import ArtifactError, LoweringError

PRELUDE = (Path(__file__).parent / "prelude.py").read_text()

__all__ = ["TritonBackend", "module_text", "triton_version", "arch_number"]


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


class TritonBackend:
    """The Triton backend (codegen/backend.py's `Backend`): one module per kernel, compiled
    for each of `archs`. `hints`: the size symbols' examples and maxima (blocks.SizeHints),
    which size dynamic dims' blocks and allow 32-bit indexing; `autotune`: block sizes timed
    at the example sizes where this machine's GPU allows (autotune.py)."""
    name = "triton"
    device = "cuda"

    def __init__(self, archs: list[str], hints: dict, *, autotune: bool = False):
        from aotc.codegen.triton.blocks import SizeHints
        self.archs, self.hints, self.autotune = list(archs), SizeHints(**hints), autotune

    def lowering(self, inference: bool) -> Lowering:
        # channels-last convolutions (cuDNN's tensor-core kernels); long reductions onto few
        # outputs in two stages, so that they fill a GPU
        return Lowering(channels_last=inference, split_reductions=True)

    def generate(self, groups: Sequence[KernelGroup]) -> GeneratedKernels:
        """Each kernel's module and arch-independent launch spec, and the builds to run.
        Kernels that index with runtime values get error codes counting from 1 across
        `groups` (one per kernel shape: `share_codes`)."""
        tuner = skipped = None
        if self.autotune:
            from aotc.codegen.triton.autotune import local_tuner
            tuner, skipped = local_tuner(self.archs, self.hints)
        sources, texts, signatures, specs, jobs, code = {}, {}, {}, {}, [], 1
        for group in groups:
            out = _generate(group.kernels, group.buffers, group.stored, self.archs,
                            code, tuner, self.hints)
            code += len(group.kernels)
            for ks, text, spec in out:
                sources[fmt.triton_source_file(ks.name)] = text.encode()
                texts[ks.name], specs[ks.name] = ks.text, spec   # the kernel, no prelude
                launch = Launch(grid=tuple(size(g) for g in spec["grid"]),
                                spec=fmt.triton_launch_file(ks.name),
                                error_code=spec["error_code"])
                signatures[ks.name] = Signature(spec["inputs"], spec["outputs"],
                                                spec["sizes"], launch)
                jobs += [(ks, text, arch, ()) for arch in self.archs]
                if ks.aligned:   # a variant for when the sizes in addresses are divisible by 16
                    jobs += [(ks, text, arch, ks.aligned) for arch in self.archs]
        tuning = None
        if self.autotune:
            tuning = tuner.summary() if tuner is not None else {"skipped": skipped}
        return GeneratedKernels(sources=sources, texts=texts, signatures=signatures,
                                work=(specs, jobs, tuning))

    def build(self, generated: GeneratedKernels) -> dict[str, bytes]:
        """Cubins for every job (kernels of one shape compile once) and the launch specs with
        each arch's build, checked against the format's limits as written."""
        specs, jobs, _ = generated.work
        specs = {name: dict(spec, archs={}) for name, spec in specs.items()}
        files = {}
        for (ks, _, arch, aligned), (cubin, meta) in zip(jobs, unique_builds(jobs)):
            path = fmt.triton_cubin_file(ks.name, arch, "div16" if aligned else None)
            files[path] = cubin
            if aligned:
                specs[ks.name]["archs"][arch]["div16"] = dict(meta, cubin=path,
                                                              sizes=list(aligned))
            else:
                specs[ks.name]["archs"][arch] = dict(meta, cubin=path)   # before its div16
        for name, spec in specs.items():
            files[fmt.triton_launch_file(name)] = data = fmt.dumps(spec)
            fits_schema(name, data, set(self.hints.maximum))
        return files

    def native(self, generated: GeneratedKernels) -> dict:
        _, _, tuning = generated.work
        native = {"kind": "triton", "triton": triton_version(), "archs": list(self.archs),
                  "kernels": sorted(generated.signatures)}
        if tuning is not None:
            native["autotune"] = tuning
        return native


def _generate(kernels, buffers: dict, stored, archs: list[str], first_code: int, tuner,
              hints) -> list:
    """[(KernelSource, module text, launch spec without builds)] for `kernels`. With a `tuner`
    (autotune.Tuner), each kernel is built with the block config it chose, and its launch spec
    records the tuning. Kernels of one shape share their error code (`share_codes`)."""
    tuned = tuner.tune(list(kernels), buffers, stored, first_code) if tuner is not None else {}
    sources = []
    for i, k in enumerate(kernels):
        config = tuned.get(k.name, (None, None))[0]
        sources.append(k.source(buffers, first_code + i) if hasattr(k, "source") else
                       kernel_source(k, buffers, stored, first_code + i, config, hints))
    out = []
    for k, ks in zip(kernels, share_codes(sources)):
        record = tuned.get(k.name, (None, None))[1]
        spec = launch_spec(ks, buffers)
        if record is not None:
            spec["autotune"] = record
        out.append((ks, module_text(ks), spec))
    return out


def fits_schema(name: str, data: bytes, symbols: set) -> None:
    """A launch spec as written, read back through the schema the runtime reads it with: what
    codegen writes fits the format's limits, or the export stops here naming the limit (never
    at load, calling the artifact damaged)."""
    from aotc.artifact.reader import load_json_obj
    from aotc.artifact.schema import parse_launch
    rel = fmt.triton_launch_file(name)
    try:
        parse_launch(load_json_obj(data, rel), name, symbols)
    except ArtifactError as e:
        raise LoweringError(f"kernel {name}'s launch spec is outside the artifact format's "
                            f"limits: {e.what}", where=rel, expected=e.expected,
                            found=e.found, fix="report this as an aotc bug with the model; "
                            "the schema's limits are in artifact/schema/launch.py") from e
