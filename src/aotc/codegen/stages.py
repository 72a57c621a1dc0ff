"""Codegen's stage values and the passes between them (the list is codegen/passes.py).

Each stage value is a frozen record of what the passes after it need; a pass is a function
`(Context, stage value) -> next stage value`. Each lowered graph holds its plan's
PlanBuilder (artifact/builder.py: typed slots, checked as they are made or changed), whose
slots the weights pass marks (codegen/layouts.py: a weight stored transposed) and which the
plan pass builds into the typed plan (codegen/plan.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from aotc.codegen import gpu_layouts as gpu
from aotc.codegen.attention_fusion import REWRITE, fuse_manual_attention
from aotc.codegen.backend import (ATEN_ONLY, NO_KERNELS, Backend, GeneratedKernels,
                                  KernelGroup, Lowering)
from aotc.codegen.graph import GraphLowering, LoweredGraph
from aotc.codegen.kernel_steps import buffers_of, kernel_step, stored_buffers
from aotc.codegen.layouts import transposed_matmul_weights
from aotc.codegen.lowering.decode import fence_early_reads
from aotc.codegen.plan import finalize
from aotc.codegen.product_groups import group_products
from aotc.codegen.scheduler import Kernel, drop_unread
from aotc.codegen.scheduler import schedule as schedule_steps
from aotc.codegen.state import fuse_cache_writes, reinplace
from aotc.codegen.target import Target
from aotc.codegen.verify import verify_lowered
from aotc.exporter.program import Program


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What every pass may read: the program, the target and its backend (None: codegen off),
    and the export's own settings."""
    program: Program
    target: Target
    backend: Backend | None
    dest: object                        # the artifact path (str or Path)
    prove: bool = True
    shard_size: int | None = None
    attachments: dict = field(default_factory=dict)
    progress: Callable = lambda message: None

    @property
    def inference(self) -> bool:
        """Codegen for inference graphs: training graphs read weights as Parameters at each
        call, so they keep them as they are."""
        return self.backend is not None and self.program.training is None

    @property
    def lowering(self) -> Lowering:
        return self.backend.lowering(self.inference) if self.backend is not None else ATEN_ONLY

    @property
    def bindings(self) -> dict:
        """Each size symbol at its declared maximum (memory statistics, layout decisions)."""
        return {k: v["max"] for k, v in self.program.symbols.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Graphs:
    graphs: dict                        # entry -> ATen graph
    flipped: tuple = ()                 # weights GPU plans read transposed (gpu_layouts.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class Lowered:
    entries: dict                       # entry -> LoweredGraph
    flipped: tuple = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """One entry scheduled: its lowered graph, steps (kernels and typed plan steps), the fusion
    decisions and its kernels."""
    lowered: LoweredGraph
    steps: list
    decisions: list
    kernels: list


@dataclass(frozen=True, slots=True, kw_only=True)
class Scheduled:
    entries: dict                       # entry -> Schedule
    flipped: tuple = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredWeights:
    weights: dict                       # stored name -> tensor (transposed ones as views)
    aliases: dict                       # tied name -> stored name
    transposed: list                    # names stored transposed


@dataclass(frozen=True, slots=True, kw_only=True)
class Weighted:
    entries: dict
    weights: StoredWeights


@dataclass(frozen=True, slots=True, kw_only=True)
class Generated:
    entries: dict
    weights: StoredWeights
    kernels: GeneratedKernels


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    weights: StoredWeights
    kernels: GeneratedKernels
    plans: dict                         # entry -> artifact.schema Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    weights: StoredWeights
    plans: dict                         # entry -> artifact.schema Plan
    files: dict                         # artifact path -> bytes: kernel sources, binaries
    native: dict | None                 # the manifest's target.native (None: no kernels)


@dataclass(frozen=True, slots=True, kw_only=True)
class Artifact:
    path: Path
    manifest: object                    # artifact.schema Manifest, as written


# ------------------------------------------------------------------------------------ passes

def entry_graphs(ctx: Context, program: Program) -> Graphs:
    graphs = program.entry_graphs()
    if program.state is not None:    # generators: cache writes in place (codegen/state.py)
        graphs = {name: fuse_cache_writes(reinplace(g)) for name, g in graphs.items()}
    return Graphs(graphs=graphs)


def gpu_layouts(ctx: Context, graphs: Graphs) -> Graphs:
    """GPU inference: weights whose products run faster transposed are read so, and one-row
    products over one input (a decode step's q/k/v at batch 1) become one product."""
    from aotc.codegen.assemble import dedup_weights
    _, aliases = dedup_weights(ctx.program.weights)
    flipped = gpu.transposed_operands(graphs.graphs, set(aliases) | set(aliases.values()))
    out = {name: group_products(gpu.with_transposed(g, flipped))
           for name, g in graphs.graphs.items()}
    return Graphs(graphs=out, flipped=tuple(flipped))


def lower_graph(graph: dict, lowering: Lowering, entry: str = "forward") -> LoweredGraph:
    """One ATen graph lowered to loop IR and extern steps, verified, unread steps dropped
    (`entry`: the plan's name, which its builder's errors give)."""
    fused = 0
    if lowering.fuse_attention:   # hand-written attention -> one SDPA call
        graph, fused = fuse_manual_attention(graph)
    lowered = GraphLowering(graph, codegen=lowering.codegen,
                            channels_last=lowering.channels_last,
                            split_reductions=lowering.split_reductions,
                            sdpa_layout=lowering.sdpa_layout, entry=entry).run()
    if fused:
        lowered.rewrites[REWRITE] = fused
    verify_lowered(lowered)
    lowered.steps = drop_unread(lowered.steps, lowered.outputs)
    return lowered


def schedule_graph(lowered: LoweredGraph) -> Schedule:
    """Fusion into kernels: (steps, decisions with reasons, the early-read fences of decode
    attention)."""
    steps, decisions = schedule_steps(lowered.steps)
    kernels = [s for s in steps if isinstance(s, Kernel)]
    return Schedule(lowered=lowered, steps=steps, decisions=decisions + fence_early_reads(steps),
                    kernels=kernels)


def lower(ctx: Context, graphs: Graphs) -> Lowered:
    ctx.progress(f"lowering {len(ctx.program.graph['nodes'])} ops")
    lowering = ctx.lowering
    entries = {}
    for name, graph in graphs.graphs.items():
        entries[name] = lowered = lower_graph(graph, lowering, name)
        gpu.mark_transposed(lowered.plan, list(graphs.flipped))
    return Lowered(entries=entries, flipped=graphs.flipped)


def schedule(ctx: Context, lowered: Lowered) -> Scheduled:
    entries = {name: schedule_graph(low) for name, low in lowered.entries.items()}
    if len(entries) > 1:   # one library for all entries: kernel names must be unique
        for name, entry in entries.items():
            for k in entry.kernels:
                k.name = f"{name}_{k.name}"
    return Scheduled(entries=entries, flipped=lowered.flipped)


def store_weights(ctx: Context, scheduled: Scheduled) -> Weighted:
    """Weights as weights.safetensors stores them: tied ones once; in CPU inference, matmul
    weights as W^T where the CPU BLAS runs the product faster that way (codegen/layouts.py,
    which marks their plan slots); on GPUs those the layouts pass chose."""
    from aotc.codegen.assemble import dedup_weights
    weights, aliases = dedup_weights(ctx.program.weights)
    if scheduled.flipped:
        for name in scheduled.flipped:
            weights[name] = weights[name].t()
        transposed = list(scheduled.flipped)
    elif ctx.inference and ctx.target.device == "cpu":
        transposed = _cpu_transposed(ctx, scheduled.entries, weights, aliases)
        for name in transposed:   # a view: the shard writer makes it contiguous, one at a time
            weights[name] = weights[name].t()
    else:
        transposed = []
    return Weighted(entries=scheduled.entries,
                    weights=StoredWeights(weights=weights, aliases=aliases,
                                          transposed=transposed))


def _cpu_transposed(ctx: Context, entries: dict, weights: dict, aliases: dict) -> list:
    """A weight is stored one way: transposed where it pays in the plan that matters (a
    generator's decode: one row per sequence), and only if every plan reading it can take it
    so. Marks the slots of the names chosen (layouts.transposed_matmul_weights)."""
    bindings = ctx.bindings
    args = {name: (e.lowered.plan, e.steps, e.lowered.outputs) for name, e in entries.items()}
    read = {name: {s.weight for s in a[0].slots if s.weight} for name, a in args.items()}
    able = {name: set(transposed_matmul_weights(*a, bindings, weights, aliases, apply=False,
                                                profit=False)) for name, a in args.items()}
    judge = (ctx.program.generation or {}).get("decode") or next(iter(args))
    pays = set(transposed_matmul_weights(*args[judge], bindings, weights, aliases,
                                         apply=False))
    allowed = {n for n in pays if all(n in able[p] for p in args if n in read[p])}
    return sorted({n for a in args.values() for n in transposed_matmul_weights(
        *a, bindings, weights, aliases, allowed=allowed, profit=False)})


def kernel_groups(entries: dict) -> list[KernelGroup]:
    """Each entry's kernels with the buffers they index, for the backend."""
    return [KernelGroup(entry=name, kernels=tuple(e.kernels),
                        buffers=buffers_of(e.lowered.slots, e.steps),
                        stored=frozenset(stored_buffers(e.steps, e.lowered.outputs)))
            for name, e in entries.items() if e.kernels]


def generate_kernels(ctx: Context, weighted: Weighted) -> Generated:
    groups = kernel_groups(weighted.entries)
    count = sum(len(g.kernels) for g in groups)
    ctx.progress(f"compiling {count} kernels" if count else "writing an ATen-only plan")
    kernels = ctx.backend.generate(groups) if groups and ctx.backend is not None else NO_KERNELS
    return Generated(entries=weighted.entries, weights=weighted.weights, kernels=kernels)


def plan(ctx: Context, generated: Generated) -> Planned:
    signatures, bindings = generated.kernels.signatures, ctx.bindings
    plans = {name: entry_plan(e, signatures, bindings, ctx.program.symbols)
             for name, e in generated.entries.items()}
    return Planned(weights=generated.weights, kernels=generated.kernels, plans=plans)


def entry_plan(entry: Schedule, signatures: dict, bindings: dict, symbols):
    """The entry's typed plan, built through its PlanBuilder (artifact/builder.py) and checked
    as a program over the declared size `symbols`."""
    lowered = entry.lowered
    steps = [kernel_step(lowered.plan, s, signatures) if isinstance(s, Kernel) else s
             for s in entry.steps]
    steps, stats = finalize(lowered.plan, steps, lowered.outputs, bindings)
    stats.update(lowered=dict(sorted(lowered.lowered.items())),
                 fallback=dict(sorted(lowered.fallback.items())),
                 kernels=len(entry.kernels), fusion=entry.decisions)
    if lowered.rewrites:
        stats["rewrites"] = dict(lowered.rewrites)
    return lowered.plan.build(lowered.inputs, steps, lowered.outputs, stats, symbols)


def build_kernels(ctx: Context, planned: Planned) -> Built:
    generated = planned.kernels
    files, native = dict(generated.sources), None
    if generated.signatures:
        files.update(ctx.backend.build(generated))
        native = ctx.backend.native(generated)
    return Built(weights=planned.weights, plans=planned.plans, files=files, native=native)


def assemble(ctx: Context, built: Built) -> Artifact:
    from aotc.codegen.assemble import write_artifact
    return write_artifact(ctx, built)
