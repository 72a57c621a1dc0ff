"""The artifact pass: plans, kernels and weights in, the artifact directory out.

The manifest (entries, weights index, target with its `native` section, options, training,
generation, quantization and tensor-parallel sections), the runner files the C++ front end
reads, the recorded samples, and the proof (`aotc/prove.py`), written atomically through
`aotc.artifact.format`.
"""
from __future__ import annotations

import platform
import sys

import torch
from safetensors.torch import save

from aotc import __version__
from aotc.artifact import format as fmt
from aotc.artifact.schema.write import build_manifest
from aotc.exporter.program import Program
from aotc.prove import artifact_check
from aotc.runtime.runner_file import runner_files


def write_artifact(ctx, built):
    """Write the artifact of `built` (a stages.Built) to `ctx.dest`: a stages.Artifact."""
    from aotc.codegen.stages import Artifact
    program, target = ctx.program, ctx.target
    files = dict(built.files)
    files.update(ctx.attachments)
    for name, plan in built.plans.items():   # written through the schema the runtime reads with
        files[fmt.plan_file(name)] = fmt.dumps(plan.to_json())
    files.update(sample_files(program))
    manifest = _manifest(program, target, built)
    check, manifest["export_check"] = artifact_check(program.samples, target.device, ctx.prove,
                                                      built.native, program.reference)
    weights, ranks = built.weights, None
    if program.tensor_parallel is not None:
        tp = program.tensor_parallel
        ranks = [_rank_stored(w, weights.weights, weights.transposed) for w in tp["ranks"]]
        manifest["tensor_parallel"] = {"world_size": tp["world_size"], "ranks": [],
                                       "sharding": {k: d for k, d in tp["sharding"].items()
                                                    if k in weights.weights}}
        check, manifest["export_check"] = None, {
            "ran": False, "why": f"a tensor-parallel artifact runs on {tp['world_size']} ranks "
                                 "under torch.distributed, not in the exporting process"}
    if check is not None:
        ctx.progress(f"proving the artifact on {manifest['export_check']['samples']} recorded "
                     "sample inputs")
    manifest = build_manifest(manifest)
    files.update(runner_files(manifest, built.plans, files.__getitem__))   # the C++ front end
    path = fmt.write_artifact(ctx.dest, files, manifest, check=check, weights=weights.weights,
                              shard_size=ctx.shard_size, rank_weights=ranks)
    return Artifact(path=path, manifest=manifest)


def _manifest(program: Program, target, built) -> dict:
    """The manifest before its export check, tensor-parallel section and files."""
    manifest = {
        "format_version": fmt.FORMAT_VERSION,
        "model": {"name": program.name, "source": program.source},
        "producer": {"aotc": __version__, "torch": torch.__version__.split("+")[0],
                     "python": platform.python_version(), "platform": sys.platform},
        "target": dict(target.to_json(portable=built.native is None), native=built.native),
        "options": program.options,
        "entries": _entries(program, built.plans),
        "weights": _weights_index(program, built.weights),
    }
    if program.training is not None:
        manifest["training"] = {k: v for k, v in program.training.items()
                                if k != "backward_inputs"}
    if program.state is not None:
        manifest["state"] = [dict(v, name=k) for k, v in program.state.items()]
        manifest["generation"] = program.generation
    if program.quantization is not None:
        manifest["quantization"] = program.quantization
    return manifest


def sample_files(program: Program) -> dict[str, bytes]:
    """The recorded inputs, eager's outputs and the float64 reference, as safetensors files."""
    if program.samples is None:
        return {}
    ins, outs = program.samples
    own = lambda ts: {str(i): t.detach().contiguous().clone() for i, t in enumerate(ts)}  # noqa: E731
    files = {fmt.SAMPLE_INPUTS: save(own(ins)),      # copies: samples may share memory
             fmt.SAMPLE_OUTPUTS: save(own(outs))}
    if program.reference:
        files[fmt.SAMPLE_REFERENCE] = save({str(i): t for i, t in program.reference.items()})
    return files


def _rank_stored(rank: dict, stored: dict, transposed: list) -> dict:
    """Another rank's weights stored as rank 0's are (`stored`): the same names, the same
    transposed layouts, tied names stored once."""
    out = {name: rank[name] for name in stored}
    for name in transposed:
        out[name] = out[name].t()
    return out


def _weights_index(program: Program, stored) -> dict:
    """The manifest's weights section before the shards are written (format.write_artifact
    adds them): counts, tied aliases, and the model's state_dict keys, a key tied to a weight
    of another name becoming an alias of it. `stored`: a stages.StoredWeights."""
    aliases = dict(stored.aliases)
    keys = None
    if program.state_dict is not None:
        keys = list(program.state_dict)
        for key, name in program.state_dict.items():
            if key not in stored.weights and key not in aliases:
                aliases[key] = aliases.get(name, name)
    return {"count": len(stored.weights) + len(aliases), "aliases": aliases,
            "transposed": stored.transposed,
            "bytes": sum(t.numel() * t.element_size() for t in stored.weights.values()),
            "shards": [], **({"state_dict": keys} if keys is not None else {})}


def _entries(program: Program, plans: dict) -> dict:
    """Manifest entry points: inputs and guards, outputs and their structure, plan stats
    (`plans`: entry -> typed Plan)."""
    if program.entries is not None:
        return {name: _entry(e["graph"], name, e["inputs"], e["symbols"], e["output_tree"],
                             plans[name]) for name, e in program.entries.items()}
    values = program.graph["values"]
    outputs = [values[o["slot"]] if "slot" in o else None for o in program.graph["outputs"]]
    out = {"forward": {"plan": fmt.plan_file("forward"), "inputs": program.inputs,
                       "symbols": program.symbols, "relations": program.relations,
                       "outputs": outputs, "output_tree": program.output_tree,
                       "stats": plans["forward"].stats}}
    if program.parameters is not None:
        out["forward"]["parameters"] = program.parameters
    if program.backward is not None:
        bvalues = program.backward["values"]
        bouts = [bvalues[o["slot"]] if "slot" in o else None
                 for o in program.backward["outputs"]]
        tree = {"kind": "tuple", "items": [{"kind": "tensor", "index": i} if o is not None
                                           else {"kind": "const", "value": None}
                                           for i, o in enumerate(bouts)]}
        out["backward"] = {"plan": fmt.plan_file("backward"),
                           "inputs": program.training["backward_inputs"], "symbols": {},
                           "relations": [], "outputs": bouts, "output_tree": tree,
                           "stats": plans["backward"].stats}
    return out


def _entry(graph: dict, name: str, inputs, symbols, tree, plan) -> dict:
    outputs = [graph["values"][o["slot"]] if "slot" in o else None for o in graph["outputs"]]
    return {"plan": fmt.plan_file(name), "inputs": inputs, "symbols": symbols, "relations": [],
            "outputs": outputs, "output_tree": tree, "stats": plan.stats}


def dedup_weights(weights: dict) -> tuple[dict, dict]:
    """Store tied weights once (safetensors refuses shared storage). No copies: the shard writer
    reads each tensor when it writes it (artifact/shards.py)."""
    stored, aliases, seen = {}, {}, {}
    for name in sorted(weights):
        t = weights[name]
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        stored[name] = t.detach()
    return stored, aliases
