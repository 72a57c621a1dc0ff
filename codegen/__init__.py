"""Stage 2, codegen: a `Program` and a `Target` in, an artifact directory out.

    lowering (graph.py: ATen graph -> loop IR and extern steps)
      -> scheduling (scheduler.py: fusion into kernels, with reasons)
      -> backend (cpp/: C++/OpenMP source, compiled once into a shared library)
      -> plan (plan.py: lifetimes, frees, stats) and the artifact, written through
         `aotc.runtime.format`, atomically.
Ops without a lowering stay extern ATen steps; with codegen off, every op does.
"""
from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch
from safetensors.torch import save

from aotc import __version__
from aotc.codegen.graph import GraphLowering
from aotc.codegen.ir import ComputedBuffer
from aotc.codegen.plan import finalize, step_uses
from aotc.codegen.scheduler import Kernel, node_loads, schedule
from aotc.codegen.target import Target
from aotc.codegen.verify import verify_lowered
from aotc.exporter.program import Program
from aotc.runtime import format as fmt
from aotc.runtime.dtypes import DTYPES
from aotc.runtime.plan import StepKind

__all__ = ["compile", "Target"]


def lower_and_schedule(program: Program, *, codegen: bool = True):
    """The compiler-free half of codegen: (lowered graph, scheduled steps, fusion decisions).
    Kernel-count tests and `aotc inspect --fusion` read this; no C++ compiler is involved."""
    lowered = GraphLowering(program.graph, codegen=codegen).run()
    verify_lowered(lowered)
    steps, decisions = schedule(lowered.steps)
    return lowered, steps, decisions


def compile(program: Program, target: Target, dest: str | Path, *,  # noqa: A001 - stage entry
            codegen: bool = True, isa: str = "auto") -> Path:
    lowered, steps, decisions = lower_and_schedule(
        program, codegen=codegen and target.device == "cpu")
    kernels = [s for s in steps if isinstance(s, Kernel)]
    files, native = {}, None
    if kernels:
        from aotc.codegen import cpp
        level = cpp.resolve_isa(isa)
        buffers = _buffers(lowered.slots)
        stored = _stored(steps, lowered.outputs)
        source, library, signatures = cpp.generate(kernels, buffers, stored, level)
        files[fmt.KERNEL_SOURCE] = source.encode()
        files[fmt.KERNEL_LIBRARY] = library
        native = {"isa": level, "compiler": cpp.compiler_description(),
                  "library": fmt.KERNEL_LIBRARY, "source": fmt.KERNEL_SOURCE}
        steps = [_kernel_step(s, signatures, lowered.slots) if isinstance(s, Kernel) else s
                 for s in steps]
        for name in {n for s in kernels for n in (b.name for b in s.writes)} - stored:
            lowered.slots[int(name[3:])]["local"] = True
    plan = finalize(lowered.slots, steps, lowered.inputs, lowered.outputs, "forward",
                    {k: v["max"] for k, v in program.symbols.items()})
    plan["stats"].update(lowered=dict(sorted(lowered.lowered.items())),
                         fallback=dict(sorted(lowered.fallback.items())),
                         kernels=len(kernels), fusion=decisions)
    files[fmt.plan_file("forward")] = fmt.dumps(plan)
    weights, aliases = _dedup_weights(program.weights)
    files[fmt.WEIGHTS] = save(weights)
    if program.samples is not None:
        ins, outs = program.samples
        own = lambda ts: {str(i): t.detach().contiguous().clone() for i, t in enumerate(ts)}
        files[fmt.SAMPLE_INPUTS] = save(own(ins))     # copies: samples may share memory
        files[fmt.SAMPLE_OUTPUTS] = save(own(outs))
    values = program.graph["values"]
    entry = {"plan": fmt.plan_file("forward"), "inputs": program.inputs,
             "symbols": program.symbols, "relations": program.relations,
             "outputs": [values[o["slot"]] for o in program.graph["outputs"]],
             "output_tree": program.output_tree, "stats": plan["stats"]}
    manifest = {
        "model": {"name": program.name, "source": program.source},
        "producer": {"aotc": __version__, "torch": torch.__version__.split("+")[0],
                     "python": platform.python_version(), "platform": sys.platform},
        "target": dict(target.to_json(portable=native is None), native=native),
        "options": program.options,
        "entries": {"forward": entry},
        "weights": {"count": len(program.weights),
                    "bytes": sum(t.numel() * t.element_size() for t in weights.values()),
                    "aliases": aliases},
    }
    return fmt.write_artifact(dest, files, manifest)


def _buffers(slots: list) -> dict:
    from aotc.codegen.ir import Buffer, sym
    return {f"buf{s['id']}": Buffer(name=f"buf{s['id']}", slot=s["id"],
                                    shape=tuple(sym(d) for d in s["shape"]),
                                    stride=tuple(sym(d) for d in s["stride"]),
                                    dtype=DTYPES[s["dtype"]])
            for s in slots if "shape" in s}


def _stored(steps: list, outputs: list) -> set:
    """Kernel-written buffers that something outside their own kernel reads."""
    needed = {f"buf{o['slot']}" for o in outputs if "slot" in o}
    for step in steps:
        if isinstance(step, Kernel):
            own = {b.name for b in step.writes}
            for node in step.nodes:
                loads, _, _ = node_loads(node, len(step.prefix))
                needed |= {name for name, _ in loads if name not in own}
            for node in step.nodes:   # pointwise results are always written to memory
                if not node.is_reduction:
                    needed |= {b.name for b in node.buffers}
        else:
            needed |= {f"buf{s}" for s in step_uses(step)}
    return needed


def _kernel_step(k: Kernel, signatures: dict, slots: list) -> dict:
    ins, outs, sizes = signatures[k.name]
    return {"kind": StepKind.KERNEL.value, "name": k.name,
            "args": [int(n[3:]) for n in ins], "out": [int(n[3:]) for n in outs],
            "sizes": sizes,
            "fused": [{"buffers": [b.name for b in n.buffers], "ops": list(n.body.origins)}
                      for n in k.nodes],
            "reasons": k.reasons}


def _dedup_weights(weights: dict) -> tuple[dict, dict]:
    """Store tied weights once (safetensors refuses shared storage); the rest as fresh copies."""
    stored, aliases, seen = {}, {}, {}
    for name in sorted(weights):
        t = weights[name]
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        stored[name] = t.detach().contiguous().clone()
    return stored, aliases
