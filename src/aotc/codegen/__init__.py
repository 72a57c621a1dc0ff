"""Stage 2, codegen: a `Program` and a `Target` in, an artifact directory out.

Codegen is the pass list of codegen/passes.py, run by one driver:

    graph -> layouts -> lower -> schedule -> weights -> kernels -> plan -> build -> artifact

lowering (graph.py: ATen graph -> loop IR and extern steps), scheduling (scheduler.py: fusion
into kernels, with reasons), a backend (codegen/backend.py's protocol; cpu: cpp/, C++/OpenMP
compiled into one shared library per CPU level; cuda: triton/, one Triton kernel per fusion
group, cubins per GPU arch), the plan (plan.py: lifetimes, frees, stats) and the artifact
(assemble.py), written through `aotc.artifact.format`, atomically. Ops without a lowering stay
extern ATen steps; with codegen off (no backend), every op does. `dump_passes` writes each
pass's output in readable form (codegen/dump.py, codegen/printer.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

from aotc.codegen.backend import Lowering, backend_for
from aotc.codegen.ir import declared_minima
from aotc.codegen.kernel_steps import buffers_of as _buffers  # noqa: F401 - tests build kernels
from aotc.codegen.kernel_steps import stored_buffers as _stored  # noqa: F401
from aotc.codegen.stages import Context, lower_graph, schedule_graph
from aotc.codegen.target import Target
from aotc.exporter.program import Program

__all__ = ["compile", "Target", "lower_and_schedule"]


def lower_and_schedule(graph: dict, *, codegen: bool = True, channels_last: bool = False,
                       split_reductions: bool = False, sdpa_layout: bool = False,
                       fuse_attention: bool = False, entry: str = "forward"):
    """The compiler-free half of codegen for one graph (the lower and schedule passes):
    (lowered graph, scheduled steps, fusion decisions). Kernel-count tests and `aotc inspect
    --fusion` read this; no compiler runs. `split_reductions`: long reductions onto few
    outputs in two stages (the Triton backend). Given a Program, size proofs use its dims'
    declared minima (`ir.declared_minima`). `entry`: the plan's name (its builder's errors
    give it)."""
    lowering = Lowering(codegen=codegen, channels_last=channels_last,
                        split_reductions=split_reductions, sdpa_layout=sdpa_layout,
                        fuse_attention=fuse_attention)
    if isinstance(graph, Program):
        with declared_minima(graph.symbols):
            scheduled = schedule_graph(lower_graph(graph.graph, lowering, entry))
    else:
        scheduled = schedule_graph(lower_graph(graph, lowering, entry))
    return scheduled.lowered, scheduled.steps, scheduled.decisions


def compile(program: Program, target: Target, dest: str | Path, *,  # noqa: A001 - stage entry
            codegen: bool = True, isa: str = "auto", autotune: bool = False,
            prove: bool = True, progress=None, shard_size: int | None = None,
            attachments: dict | None = None, dump_passes: str | Path | None = None) -> Path:
    """`autotune` (CUDA): time candidate block sizes of each kernel on this machine's GPU,
    at the sizes the program was exported with (codegen/triton/autotune.py). Size proofs
    (masks, slice starts) hold over the dims' declared ranges, which the guards enforce.
    `prove`: load the written artifact and run it on the recorded samples against eager's
    outputs before it replaces `dest` (`aotc/prove.py`); `progress(message)` hears each
    stage. `shard_size`: the largest weights file, in bytes (artifact/shards.py).
    `attachments`: files the artifact carries as they are (artifact path -> bytes: a model
    folder's tokenizer files under tokenizer/), listed and hashed like the others.
    `dump_passes`: a folder to write each pass's output into, readable (codegen/dump.py)."""
    from aotc.codegen.passes import run_passes
    target = _resolve_archs(target, codegen)
    hints = {"example": {k: v["example"] for k, v in program.symbols.items()},
             "maximum": {k: v["max"] for k, v in program.symbols.items()}}
    ctx = Context(program=program, target=target,
                  backend=backend_for(target, codegen=codegen, isa=isa, autotune=autotune,
                                      hints=hints),
                  dest=dest, prove=prove, shard_size=shard_size,
                  attachments=attachments or {},
                  progress=progress or (lambda message: None))
    with declared_minima(program.symbols):
        artifact = run_passes(ctx, program,
                              dump=Path(dump_passes) if dump_passes is not None else None)
    return artifact.path


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
