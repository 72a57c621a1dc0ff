"""Codegen as a list of passes: a `Program` in, an artifact directory out.

Each pass is a named function from one stage value to the next; `PASSES` is the list, and
`run_passes` the one driver that runs it (timing each pass for `--debug` logging, and with
`dump` writing each pass's output in readable form, codegen/dump.py):

    graph      Program    -> Graphs     each entry's ATen graph (generators: cache writes in
                                        place, codegen/state.py)
    layouts    Graphs     -> Graphs     GPU inference: weights read transposed, one-row
                                        products grouped (codegen/gpu_layouts.py)
    lower      Graphs     -> Lowered    ATen -> loop IR and extern steps, verified
                                        (codegen/graph.py, verify.py)
    schedule   Lowered    -> Scheduled  fusion into kernels, each decision with a reason
                                        (codegen/scheduler.py)
    weights    Scheduled  -> Weighted   weights as stored: tied ones once, transposed where a
                                        layout pays (codegen/layouts.py, gpu_layouts.py)
    kernels    Weighted   -> Generated  the backend's kernel sources and signatures
    plan       Generated  -> Planned    lifetimes, frees, buffer reuse, typed plans (plan.py)
    build      Planned    -> Built      the backend's compiler: libraries or cubins
    artifact   Built      -> Artifact   manifest, runner files, the proof, written atomically
                                        (codegen/assemble.py)

Which backend compiles (codegen/backend.py: C++ for cpu, Triton for cuda, none with
--no-codegen) decides how graphs are lowered; a pass whose `when` is false for the context is
skipped (its input passes through).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from aotc.codegen.backend import Backend
from aotc.codegen.stages import (Artifact, Built, Context, Generated, Graphs, Lowered, Planned,
                                 Scheduled, Weighted, assemble, build_kernels, entry_graphs,
                                 generate_kernels, gpu_layouts, lower, plan, schedule,
                                 store_weights)
from aotc.errors import LoweringError
from aotc.exporter.program import Program

log = logging.getLogger("aotc.codegen")


@dataclass(frozen=True, slots=True)
class Pass:
    name: str
    run: Callable          # (Context, input) -> output
    input: type
    output: type
    doc: str
    when: Callable | None = None   # (Context) -> whether it runs; None: always


def _gpu_inference(ctx: Context) -> bool:
    """GPU inference only"""
    backend = ctx.backend
    return backend is not None and backend.device == "cuda" and ctx.inference


PASSES: tuple[Pass, ...] = (
    Pass("graph", entry_graphs, Program, Graphs, "each entry's ATen graph"),
    Pass("layouts", gpu_layouts, Graphs, Graphs, "GPU weight layouts and grouped products",
         when=_gpu_inference),
    Pass("lower", lower, Graphs, Lowered, "ATen graph -> loop IR and extern steps"),
    Pass("schedule", schedule, Lowered, Scheduled, "fusion into kernels, with reasons"),
    Pass("weights", store_weights, Scheduled, Weighted, "weights as the artifact stores them"),
    Pass("kernels", generate_kernels, Weighted, Generated, "the backend's kernel sources"),
    Pass("plan", plan, Generated, Planned, "lifetimes, frees and buffer reuse: typed plans"),
    Pass("build", build_kernels, Planned, Built, "the backend's compiler"),
    Pass("artifact", assemble, Built, Artifact, "manifest, runner files, proof, written"),
)


def run_passes(ctx: Context, program: Program, passes: tuple[Pass, ...] = PASSES, *,
               dump: Path | None = None):
    """Run `passes` in order from `program`; the last pass's output. With `dump`, each pass's
    output is written under it as it is made (so a failing export leaves the passes before
    the failure), numbered by position in `passes` (codegen/dump.py)."""
    from aotc.codegen.dump import Dumper
    dumper = Dumper(Path(dump), passes) if dump is not None else None
    value = program
    for number, p in enumerate(passes, 1):
        if p.when is not None and not p.when(ctx):
            log.debug("pass %s: skipped", p.name)
            if dumper is not None:
                dumper.skipped(number, p)
            continue
        if not isinstance(value, p.input):
            raise _misordered(p, value)
        start = time.perf_counter()
        value = p.run(ctx, value)
        took = time.perf_counter() - start
        if not isinstance(value, p.output):
            raise _misordered(p, value, made=True)
        log.debug("pass %s: %.3f s", p.name, took)
        if dumper is not None:
            dumper.write(number, p, value, took)
    return value


def _misordered(p: Pass, value, made: bool = False) -> LoweringError:
    what = (f"pass {p.name} made a {type(value).__name__}" if made
            else f"pass {p.name} was given a {type(value).__name__}")
    want = p.output if made else p.input
    return LoweringError(what, where=f"codegen pass {p.name}", expected=want.__name__,
                         found=type(value).__name__,
                         fix="report this as an aotc bug (codegen/passes.py PASSES)")


__all__ = ["PASSES", "Pass", "run_passes", "Backend", "Context"]
