"""Stage 2, codegen: a `Program` and a `Target` in, an artifact directory out.

    lowering (graph.py: ATen graph -> loop IR and extern steps)
      -> scheduling (scheduler.py: fusion into kernels, with reasons)
      -> backend (cpu: cpp/, C++/OpenMP source compiled once into a shared library;
                  cuda: triton/, one Triton kernel per fusion group, cubins per GPU arch)
      -> plan (plan.py: lifetimes, frees, stats) and the artifact, written through
         `aotc.artifact.format`, atomically.
Ops without a lowering stay extern ATen steps; with codegen off, every op does.
"""
from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch
from safetensors.torch import save

from aotc import __version__
from aotc.errors import ArtifactError, LoweringError
from aotc.codegen.attention_fusion import REWRITE, fuse_manual_attention
from aotc.codegen.graph import GraphLowering
from aotc.codegen.index_checks import kernel_checks
from aotc.codegen.ir import declared_minima
from aotc.codegen import gpu_layouts
from aotc.codegen.layouts import transposed_matmul_weights
from aotc.codegen.lowering.decode import fence_early_reads
from aotc.codegen.plan import finalize
from aotc.codegen.product_groups import group_products
from aotc.codegen.scheduler import Kernel, drop_unread, schedule
from aotc.codegen.state import fuse_cache_writes, reinplace
from aotc.codegen.target import Target
from aotc.codegen.verify import verify_lowered
from aotc.exporter.program import Program
from aotc.prove import artifact_check
from aotc.artifact import format as fmt
from aotc.artifact.dtypes import DTYPES
from aotc.artifact.builder import Launch, size
from aotc.artifact.schema.plan import CallStep, SlotRef
from aotc.artifact.schema.types import SlotKind, StepKind
from aotc.runtime.runner_file import runner_files
from aotc.artifact.schema.write import build_manifest

__all__ = ["compile", "Target"]


def lower_and_schedule(graph: dict, *, codegen: bool = True, channels_last: bool = False,
                       split_reductions: bool = False, sdpa_layout: bool = False,
                       fuse_attention: bool = False, entry: str = "forward"):
    """The compiler-free half of codegen for one graph: (lowered graph, scheduled steps, fusion
    decisions). Kernel-count tests and `aotc inspect --fusion` read this; no compiler runs.
    `split_reductions`: long reductions onto few outputs in two stages (the Triton backend).
    Given a Program, size proofs use its dims' declared minima (`ir.declared_minima`)."""
    if isinstance(graph, Program):
        with declared_minima(graph.symbols):
            return lower_and_schedule(graph.graph, codegen=codegen, channels_last=channels_last,
                                      split_reductions=split_reductions, sdpa_layout=sdpa_layout,
                                      fuse_attention=fuse_attention, entry=entry)
    fused = 0
    if fuse_attention:   # hand-written attention -> one SDPA call (codegen/attention_fusion.py)
        graph, fused = fuse_manual_attention(graph)
    lowered = GraphLowering(graph, codegen=codegen, channels_last=channels_last,
                            split_reductions=split_reductions, sdpa_layout=sdpa_layout,
                            entry=entry).run()
    if fused:
        lowered.rewrites[REWRITE] = fused
    verify_lowered(lowered)
    lowered.steps = drop_unread(lowered.steps, lowered.outputs)
    steps, decisions = schedule(lowered.steps)
    return lowered, steps, decisions + fence_early_reads(steps)


def compile(program: Program, target: Target, dest: str | Path, *,  # noqa: A001 - stage entry
            codegen: bool = True, isa: str = "auto", autotune: bool = False,
            prove: bool = True, progress=None, shard_size: int | None = None,
            attachments: dict | None = None) -> Path:
    """`autotune` (CUDA): time candidate block sizes of each kernel on this machine's GPU,
    at the sizes the program was exported with (codegen/triton/autotune.py). Size proofs
    (masks, slice starts) hold over the dims' declared ranges, which the guards enforce.
    `prove`: load the written artifact and run it on the recorded samples against eager's
    outputs before it replaces `dest` (`aotc/prove.py`); `progress(message)` hears each
    stage. `shard_size`: the largest weights file, in bytes (artifact/shards.py).
    `attachments`: files the artifact carries as they are (artifact path -> bytes: a model
    folder's tokenizer files under tokenizer/), listed and hashed like the others."""
    with declared_minima(program.symbols):
        return _compile(program, target, dest, codegen=codegen, isa=isa, autotune=autotune,
                        prove=prove, progress=progress or (lambda message: None),
                        shard_size=shard_size, attachments=attachments or {})


def _compile(program: Program, target: Target, dest: str | Path, *, codegen: bool,
             isa: str, autotune: bool, prove: bool, progress, shard_size: int | None,
             attachments: dict) -> Path:
    target = _resolve_archs(target, codegen)
    progress(f"lowering {len(program.graph['nodes'])} ops")
    parts, gpu_transposed = _lower_entries(program, target, codegen)
    count = sum(len(kernels) for *_, kernels in parts.values())
    progress(f"compiling {count} kernels" if count else "writing an ATen-only plan")
    bindings = {k: v["max"] for k, v in program.symbols.items()}
    hints = {"example": {k: v["example"] for k, v in program.symbols.items()}, "maximum": bindings}
    weights, aliases, transposed = _stored_weights(program, parts, target, codegen, bindings,
                                                   gpu_transposed)
    files, native, signatures = _build_native(parts, isa, target, hints, autotune)
    files.update(attachments)
    typed = {name: _plan(lowered, steps, decisions, kernels, signatures, bindings,
                         program.symbols)
             for name, (lowered, steps, decisions, kernels) in parts.items()}
    for name, plan in typed.items():   # written through the schema the runtime reads with
        files[fmt.plan_file(name)] = fmt.dumps(plan.to_json())
    files.update(_sample_files(program))
    manifest = {
        "format_version": fmt.FORMAT_VERSION,
        "model": {"name": program.name, "source": program.source},
        "producer": {"aotc": __version__, "torch": torch.__version__.split("+")[0],
                     "python": platform.python_version(), "platform": sys.platform},
        "target": dict(target.to_json(portable=native is None), native=native),
        "options": program.options,
        "entries": _entries(program, typed),
        "weights": _weights_index(program, weights, aliases, transposed),
    }
    if program.training is not None:
        manifest["training"] = {k: v for k, v in program.training.items()
                                if k != "backward_inputs"}
    if program.state is not None:
        manifest["state"] = [dict(v, name=k) for k, v in program.state.items()]
        manifest["generation"] = program.generation
    if program.quantization is not None:
        manifest["quantization"] = program.quantization
    check, manifest["export_check"] = artifact_check(program.samples, target.device, prove,
                                                      native, program.reference)
    ranks = None
    if program.tensor_parallel is not None:
        tp = program.tensor_parallel
        ranks = [_rank_stored(w, weights, transposed) for w in tp["ranks"]]
        manifest["tensor_parallel"] = {"world_size": tp["world_size"], "ranks": [],
                                       "sharding": {k: d for k, d in tp["sharding"].items()
                                                    if k in weights}}
        check, manifest["export_check"] = None, {
            "ran": False, "why": f"a tensor-parallel artifact runs on {tp['world_size']} ranks "
                                 "under torch.distributed, not in the exporting process"}
    if check is not None:
        progress(f"proving the artifact on {manifest['export_check']['samples']} recorded "
                 "sample inputs")
    manifest = build_manifest(manifest)
    files.update(runner_files(manifest, typed, files.__getitem__))   # for the C++ front end
    return fmt.write_artifact(dest, files, manifest, check=check,
                              weights=weights, shard_size=shard_size, rank_weights=ranks)


def _sample_files(program: Program) -> dict[str, bytes]:
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


def _weights_index(program: Program, stored: dict, aliases: dict, transposed: list) -> dict:
    """The manifest's weights section before the shards are written (format.write_artifact
    adds them): counts, tied aliases, and the model's state_dict keys, a key tied to a weight
    of another name becoming an alias of it."""
    aliases = dict(aliases)
    keys = None
    if program.state_dict is not None:
        keys = list(program.state_dict)
        for key, name in program.state_dict.items():
            if key not in stored and key not in aliases:
                aliases[key] = aliases.get(name, name)
    return {"count": len(stored) + len(aliases), "aliases": aliases, "transposed": transposed,
            "bytes": sum(t.numel() * t.element_size() for t in stored.values()), "shards": [],
            **({"state_dict": keys} if keys is not None else {})}


def _lower_entries(program: Program, target: Target, codegen: bool) -> tuple[dict, list]:
    """Each entry (forward, and backward for training) lowered and scheduled: (name ->
    (lowered graph, steps, fusion decisions, kernels), the weights a GPU plan reads
    transposed, codegen/gpu_layouts.py)."""
    graphs = program.entry_graphs()
    if program.state is not None:    # generators: cache writes in place (codegen/state.py)
        graphs = {name: fuse_cache_writes(reinplace(g)) for name, g in graphs.items()}
    # inference only: training graphs read weights as Parameters at each call, so they keep
    # them as they are
    inference = codegen and program.training is None
    cpu = codegen and target.device == "cpu"
    flipped = []
    if inference and target.device == "cuda":
        _, aliases = _dedup_weights(program.weights)
        flipped = gpu_layouts.transposed_operands(graphs, set(aliases) | set(aliases.values()))
        graphs = {name: gpu_layouts.with_transposed(g, flipped) for name, g in graphs.items()}
        # one-row products over one input (a decode step's q/k/v at batch 1): one product
        graphs = {name: group_products(g) for name, g in graphs.items()}
    parts = {}
    for name, graph in graphs.items():
        lowered, steps, decisions = lower_and_schedule(
            graph, codegen=codegen,
            # channels-last convolutions, the fast layout of oneDNN (CPU) and of cuDNN's
            # tensor-core kernels (GPU)
            channels_last=inference,
            split_reductions=codegen and target.device == "cuda",
            # SDPA outputs where the CPU's attention puts them (the export machine's torch);
            # hand-written attention as SDPA in CPU inference (not measured on GPUs yet)
            sdpa_layout=cpu, fuse_attention=cpu and inference, entry=name)
        gpu_layouts.mark_transposed(lowered.plan, flipped)
        kernels = [s for s in steps if isinstance(s, Kernel)]
        if len(graphs) > 1:   # one library for all entries: kernel names must be unique
            for k in kernels:
                k.name = f"{name}_{k.name}"
        parts[name] = (lowered, steps, decisions, kernels)
    return parts, flipped


def _stored_weights(program: Program, parts: dict, target: Target, codegen: bool,
                    bindings: dict, gpu_transposed: list) -> tuple[dict, dict, list]:
    """(weights as weights.safetensors stores them, tied aliases, names stored transposed):
    in CPU inference, matmul weights are stored as W^T where the CPU BLAS runs the product
    faster that way (codegen/layouts.py; their plan slots say so); on GPUs `gpu_transposed`,
    which the plans were lowered for (codegen/gpu_layouts.py)."""
    weights, aliases = _dedup_weights(program.weights)
    if gpu_transposed:
        for name in gpu_transposed:
            weights[name] = weights[name].t()
        return weights, aliases, list(gpu_transposed)
    if not (codegen and target.device == "cpu" and program.training is None):
        return weights, aliases, []
    args = {name: (lowered.plan, steps, lowered.outputs)
            for name, (lowered, steps, _, _) in parts.items()}
    read = {name: {s.weight for s in a[0].slots if s.weight} for name, a in args.items()}
    able = {name: set(transposed_matmul_weights(*a, bindings, weights, aliases, apply=False,
                                                profit=False)) for name, a in args.items()}
    # a weight is stored one way: transposed where it pays in the plan that matters (a
    # generator's decode: one row per sequence), and only if every plan reading it can
    # take it so
    judge = (program.generation or {}).get("decode") or next(iter(args))
    pays = set(transposed_matmul_weights(*args[judge], bindings, weights, aliases,
                                         apply=False))
    allowed = {n for n in pays if all(n in able[p] for p in args if n in read[p])}
    transposed = sorted({n for a in args.values() for n in transposed_matmul_weights(
        *a, bindings, weights, aliases, allowed=allowed, profit=False)})
    for name in transposed:   # a view: the shard writer makes it contiguous, one at a time
        weights[name] = weights[name].t()
    return weights, aliases, transposed


def _build_native(parts: dict, isa: str, target: Target, hints: dict, autotune: bool):
    """Compile every entry's kernels into one library: (files, manifest native, signatures).
    `hints`: the size symbols' example sizes and maxima (CUDA block heuristics size dynamic
    dims for the examples and index in 32 bits where the maxima allow; `autotune` times
    CUDA kernels at the examples)."""
    groups = [(kernels, _buffers(lowered.slots, steps), _stored(steps, lowered.outputs))
              for lowered, steps, _, kernels in parts.values() if kernels]
    if not groups:
        return {}, None, {}
    if target.device == "cuda":
        return _build_triton(parts, groups, target, hints, autotune)
    from aotc.codegen import cpp
    levels = cpp.resolve_isa(isa)
    source, libraries, signatures = cpp.generate(groups, levels)
    files = {fmt.KERNEL_SOURCE: source.encode(),
             **{fmt.kernel_library(level): lib for level, lib in libraries.items()}}
    native = {"compiler": cpp.compiler_description(levels), "source": fmt.KERNEL_SOURCE,
              "libraries": {level: fmt.kernel_library(level) for level in levels},
              "table": True}
    return files, native, signatures


def _plan(lowered, steps, decisions, kernels, signatures, bindings, symbols):
    """The entry's typed plan, built through its PlanBuilder (artifact/builder.py)."""
    steps = [_kernel_step(lowered.plan, s, signatures) if isinstance(s, Kernel) else s
             for s in steps]
    steps, stats = finalize(lowered.plan, steps, lowered.outputs, bindings)
    stats.update(lowered=dict(sorted(lowered.lowered.items())),
                 fallback=dict(sorted(lowered.fallback.items())),
                 kernels=len(kernels), fusion=decisions)
    if lowered.rewrites:
        stats["rewrites"] = dict(lowered.rewrites)
    return lowered.plan.build(lowered.inputs, steps, lowered.outputs, stats, symbols)


def _entries(program: Program, plans: dict) -> dict:
    """Manifest entry points: inputs and guards, outputs and their structure, plan stats."""
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


def _buffers(slots, steps: list = ()) -> dict:
    """The tensor slots (typed) as the loop IR's Buffers, by name."""
    from aotc.codegen.ir import Buffer, dims
    constant = _constant_slots(slots, steps)
    return {f"buf{s.id}": Buffer(name=f"buf{s.id}", slot=s.id, shape=dims(s.shape),
                                 stride=dims(s.stride), dtype=DTYPES[s.dtype],
                                 constant=s.id in constant)
            for s in slots if s.is_tensor}


def _constant_slots(slots, steps) -> set[int]:
    """Slots no step writes: the weights and the views of them (in plan order)."""
    out = {s.id for s in slots if s.kind is SlotKind.WEIGHT}
    for step in steps:
        if isinstance(step, CallStep) and step.kind is StepKind.VIEW:
            base = step.args[0] if step.args else None
            if isinstance(base, SlotRef) and base.slot in out:
                out |= set(o for o in step.out if o is not None)
    return out


def _stored(steps: list, outputs: list) -> set:
    """Kernel-written buffers that something outside their own kernel reads."""
    needed = {f"buf{o.slot}" for o in outputs if o.slot is not None}
    for step in steps:
        if isinstance(step, Kernel):
            needed |= step.reads - {b.name for b in step.writes}
            for node in step.nodes:   # pointwise results are always written to memory
                if not node.is_reduction:
                    needed |= {b.name for b in node.buffers}
        else:
            needed |= {f"buf{s}" for s in step.reads()}
    return needed


def _resolve_archs(target: Target, codegen: bool) -> Target:
    """`cuda` without archs means this machine's GPU; cross-compiling needs them named."""
    if target.device != "cuda" or target.archs or not codegen:
        return target
    if not torch.cuda.is_available():
        from aotc.errors import UsageError
        raise UsageError("target cuda names no GPU architecture and this machine has no GPU",
                         where="--target", expected="cuda:sm_XX[,sm_YY]", found=str(target),
                         fix="name the archs to cross-compile for, e.g. --target cuda:sm_90")
    major, minor = torch.cuda.get_device_capability()
    return Target(device="cuda", archs=(f"sm_{major}{minor}",))


def _build_triton(parts: dict, groups: list, target: Target, hints: dict, autotune: bool):
    """CUDA: Triton kernels compiled for each arch of `target` (codegen/triton): (files,
    manifest native, signatures with each kernel's launch: grid, spec file, error code).
    With `autotune`, block sizes are timed at the example sizes where this machine's GPU
    allows."""
    from aotc.codegen import triton as tb
    from aotc.codegen.triton.blocks import SizeHints
    hints = SizeHints(**hints)
    tuner = skipped = None
    if autotune:
        from aotc.codegen.triton.autotune import local_tuner
        tuner, skipped = local_tuner(list(target.archs), hints)
    files, signatures, code = {}, {}, 1
    for kernels, buffers, stored in groups:
        out, specs = tb.generate(kernels, buffers, stored, list(target.archs), first_code=code,
                                 tuner=tuner, hints=hints)
        code += len(kernels)
        files.update(out)
        for name, spec in specs.items():
            _fits_schema(name, out[fmt.triton_launch_file(name)], set(hints.maximum))
            launch = Launch(grid=tuple(size(g) for g in spec["grid"]),
                            spec=fmt.triton_launch_file(name), error_code=spec["error_code"])
            signatures[name] = (spec["inputs"], spec["outputs"], spec["sizes"], launch)
    native = {"kind": "triton", "triton": tb.triton_version(), "archs": list(target.archs),
              "kernels": sorted(signatures)}
    if autotune:
        native["autotune"] = tuner.summary() if tuner is not None else {"skipped": skipped}
    return files, native, signatures


def _fits_schema(name: str, data: bytes, symbols: set) -> None:
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


def _kernel_step(plan, k: Kernel, signatures: dict):
    """The plan step launching kernel `k` (`plan`: the entry's PlanBuilder)."""
    ins, outs, sizes, *launch = signatures[k.name]
    return plan.kernel(
        k.name, [int(n[3:]) for n in ins], [int(n[3:]) for n in outs], sizes=sizes,
        # Triton kernels: grid over the size symbols, launch spec file, error code
        launch=launch[0] if launch else None,
        checks=kernel_checks(k, list(ins)),
        fused=[{"buffers": [b.name for b in n.buffers], "ops": list(n.body.origins)}
               for n in k.nodes],
        reasons=k.reasons)


def _dedup_weights(weights: dict) -> tuple[dict, dict]:
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
