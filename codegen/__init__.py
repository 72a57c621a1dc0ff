"""Stage 2, codegen: a `Program` and a `Target` in, an artifact directory out.

First form: every ATen op becomes an extern step of the launch plan (the fallback path that
generated kernels replace op by op). Views are planned as aliases and lifetimes as FREE steps.
The artifact is written through `aotc.runtime.format`, atomically.
"""
from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch
from safetensors.torch import save

from aotc import __version__
from aotc.codegen.plan import build_plan
from aotc.codegen.target import Target
from aotc.exporter.program import Program
from aotc.runtime import format as fmt

__all__ = ["compile", "Target"]


def compile(program: Program, target: Target, dest: str | Path) -> Path:  # noqa: A001 - stage entry
    plan = build_plan(program.graph, "forward")
    weights, aliases = _dedup_weights(program.weights)
    files = {fmt.WEIGHTS: save(weights), fmt.plan_file("forward"): fmt.dumps(plan)}
    if program.samples is not None:
        ins, outs = program.samples
        files[fmt.SAMPLE_INPUTS] = save({str(i): t.contiguous() for i, t in enumerate(ins)})
        files[fmt.SAMPLE_OUTPUTS] = save({str(i): t.contiguous() for i, t in enumerate(outs)})
    values = program.graph["values"]
    entry = {"plan": fmt.plan_file("forward"), "inputs": program.inputs,
             "symbols": program.symbols, "relations": program.relations,
             "outputs": [values[o["slot"]] for o in program.graph["outputs"]],
             "output_tree": program.output_tree, "stats": plan["stats"]}
    manifest = {
        "model": {"name": program.name, "source": program.source},
        "producer": {"aotc": __version__, "torch": torch.__version__.split("+")[0],
                     "python": platform.python_version(), "platform": sys.platform},
        "target": target.to_json(portable=True),
        "options": program.options,
        "entries": {"forward": entry},
        "weights": {"count": len(program.weights),
                    "bytes": sum(t.numel() * t.element_size() for t in weights.values()),
                    "aliases": aliases},
    }
    return fmt.write_artifact(dest, files, manifest)


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
