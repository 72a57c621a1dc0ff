"""One zoo model, checked in this process: export with aotc, load, compare with eager on the
example inputs and on fresh inputs, and time torch.compile's first call on the same model.

`check(spec, size, workdir)` returns the model's record (JSON-ready):
  status       pass | mismatch | run_failed | export_failed | capture_failed | build_failed
               | skipped (capture_failed: torch.export itself cannot capture the model;
               build_failed: the library refuses the zoo's config or eager fails; both are
               reported apart, since no exporter built on torch.export can pass them)
  error_class  the exception's class (an aotc error class, or torch's)
  message      its first lines
  export_s     aotc.export's wall time; stages: seconds per progress stage
  compile_s    torch.compile's first call (its compile time), same process, fresh caches
  kernels, externs   generated kernels and extern calls in the forward plan
The parent (`benchmarks/zoo.py`) runs this in a process of its own, under a time limit.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from benchmarks.accuracy import judge
from benchmarks.harness import describe, reference, release
from benchmarks.systems import Aotc, TorchCompile, environment, fresh_cache, warm_up
from benchmarks.zoo_dynamic import dynamic_shapes, resized


class Stages:
    """The export's progress callback: seconds spent in each stage it announces."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self._stage, self._t0 = None, time.perf_counter()

    def __call__(self, message: str) -> None:
        self._close()
        self._stage = message.split(" (")[0]

    def _close(self) -> None:
        now = time.perf_counter()
        if self._stage is not None:
            self.times[self._stage] = round(self.times.get(self._stage, 0.0) + now - self._t0, 3)
        self._t0 = now

    def done(self) -> dict:
        self._close()
        self._stage = None
        return self.times


def check(spec, size: str, workdir: Path, *, compile_baseline: bool = True,
          dynamic: bool = False) -> dict:
    """`dynamic`: export with dynamic batch and sequence, and check other sizes too
    (benchmarks/zoo_dynamic.py)."""
    rec = {"model": spec.name, "family": spec.family, "size": size}
    why = spec.available()
    if why:
        return dict(rec, status="skipped", message=why)
    dims = None
    try:   # a config the library refuses, or an eager failure, is the zoo's problem
        model, inputs = spec.make(size, "latency")
        fresh = spec.inputs(size, spec.batch(size, "latency"), torch.Generator().manual_seed(1))
        sets = [inputs, fresh]
        if dynamic:
            dims = dynamic_shapes(inputs)
            sets += resized(spec, size, dims, seed=1)
        with torch.no_grad():
            eager = [model(*x) for x in sets]
    except Exception as e:
        return dict(rec, status="build_failed", error_class=type(e).__name__,
                    message=describe(e, 1200))
    rec["inputs"] = [f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in inputs]
    if dims is not None:
        rec["dynamic"] = [{d: dim.__name__ for d, dim in x.items()} for x in dims]
    refs = [reference(model, x, torch.device("cpu"))[0] for x in sets]
    rec.update(_export_and_compare(model, sets, eager, refs, workdir, dims))
    if compile_baseline:
        rec.update(_torch_compile(model, inputs, workdir / "inductor"))
    return rec


def _export_and_compare(model, sets, eager, refs, workdir: Path, dims=None) -> dict:
    import aotc
    from aotc.errors import ExportError
    stages, path = Stages(), workdir / "model.aotc"
    inputs = sets[0]
    t0 = time.perf_counter()
    try:   # a cold export: aotc's compiled-kernel cache starts empty, as Inductor's does
        with environment(Aotc.cache_env, str(workdir / "cache")):
            aotc.export(model, inputs, path, progress=stages, dynamic_shapes=dims)
    except Exception as e:   # every failure is a result
        out = {"export_s": round(time.perf_counter() - t0, 3), "stages": stages.done(),
               "error_class": type(e).__name__, "message": describe(e, 1200)}
        torch_error = _torch_export_error(model, inputs, dims) \
            if isinstance(e, ExportError) else None
        out["status"] = "capture_failed" if torch_error else "export_failed"
        if torch_error:
            out["torch_export_message"] = torch_error
        return out
    out = {"export_s": round(time.perf_counter() - t0, 3), "stages": stages.done()}
    out.update(plan_counts(path))
    labels = ("example", "fresh", "batch 3, shorter", "batch 1")
    try:
        module = aotc.load(path)
        got = []
        for label, x in zip(labels, sets):
            got.append(module(*x))
    except Exception as e:
        return dict(out, status="run_failed", error_class=type(e).__name__,
                    message=f"{label} inputs: {describe(e, 1200)}")
    for label, g, e, r in zip(labels, got, eager, refs):
        verdict = judge(g, e, r)
        if not verdict.ok:
            return dict(out, status="mismatch", error_class="Mismatch",
                        message=f"{label} inputs: {verdict.reason}")
        out[f"{label.split(',')[0].replace(' ', '_')}_error"] = verdict.error
    return dict(out, status="pass")


def _torch_export_error(model, inputs, dims=None) -> str | None:
    """Why plain torch.export (strict, as aotc captures) fails on the model, or None if it
    captures it: an aotc export error on a model torch.export cannot capture is capture's
    limit, not aotc's."""
    try:
        torch.export.export(model, inputs, dynamic_shapes=dims)
        return None
    except Exception as e:
        return describe(e, 600)


def plan_counts(path: Path) -> dict:
    """Generated kernels and extern (ATen) calls of the artifact's forward plan."""
    manifest = json.loads((path / "manifest.json").read_text())
    stats = manifest["entries"]["forward"]["stats"]
    return {"kernels": stats.get("kernels", 0),
            "externs": sum(stats.get("fallback", {}).values()),
            "artifact_target": manifest["target"].get("device")}


def _torch_compile(model, inputs, workdir: Path) -> dict:
    """torch.compile's first call (its compile time) in fresh Inductor caches, after
    Inductor's one-time import and start-up are paid (as the timed suite does)."""
    system = TorchCompile()
    workdir.mkdir(parents=True, exist_ok=True)
    warm_up([system], torch.device("cpu"))
    release()
    try:
        with fresh_cache(system, workdir), torch.no_grad():
            call = system.build(model, inputs, workdir).call
            t0 = time.perf_counter()
            call()
            return {"compile_s": round(time.perf_counter() - t0, 3)}
    except Exception as e:
        return {"compile_s": None, "compile_error": describe(e, 400)}
    finally:
        release()
