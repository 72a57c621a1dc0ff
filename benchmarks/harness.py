"""The protocol: how one (model, point) is measured on every system. Modelled on PyTorch's own
compiler benchmarks (benchmarks/dynamo/common.py).

For each model at each point (latency: batch 1; throughput: a larger batch):
  1. build the model (seeded random weights) and inputs in float32 on the CPU;
  2. reference: a copy of the model and the float inputs cast to float64, run once on the device;
  3. cast the model and float inputs to the run dtype (fp32 or bf16) on the device;
  4. per system, eager first: build (export / compile; timed), load (timed), first call (timed;
     for torch.compile it includes compilation), each system alone in a try block with a time
     limit, so one failure is recorded and the run goes on;
  5. eager is run a second time: outputs that are not bitwise equal to the first run make every
     system's status `eager_nondeterministic` (accuracy cannot be judged);
  6. each system's first-call outputs are judged by `benchmarks.accuracy.judge`;
  7. timing: every system warmed up, then rounds in which each system runs once, interleaved (the
     order rotates every round), synchronizing the device after each call, until both a minimum
     number of rounds and a time budget are reached (or a maximum of rounds); medians are kept;
     speedup = eager median / system median.

Status per system: pass | fail_accuracy | fail_export (export or compile failed or timed out;
for torch.compile that includes its first call) | fail_run | eager_nondeterministic | skipped
(the system or model cannot run here, or the eager baseline failed).
"""
from __future__ import annotations

import copy
import gc
import math
import signal
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch

from benchmarks.accuracy import flatten, identical, judge
from benchmarks.systems import Built, System, fresh_cache

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Status(str, Enum):
    PASS = "pass"
    FAIL_ACCURACY = "fail_accuracy"
    FAIL_EXPORT = "fail_export"
    FAIL_RUN = "fail_run"
    EAGER_NONDETERMINISTIC = "eager_nondeterministic"
    SKIPPED = "skipped"

    __str__, __format__ = str.__str__, str.__format__   # print as the bare value: pass


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    device: str = "cpu"
    dtype: str = "fp32"
    warmup: int = 3            # untimed calls per system before the timed rounds
    min_reps: int = 10         # timed rounds, at least
    max_reps: int = 200        # timed rounds, at most
    timing_s: float = 3.0      # keep adding rounds until this much time is spent (per point)
    build_limit_s: float = 300.0   # per system: build + load + first call
    seed: int = 0


# ---------------------------------------------------------------------------------- one point
def run_point(spec, size: str, point: str, systems: list[System], cfg: Config) -> dict:
    """Measure `spec` at `point` on every system; returns the JSON record for that row."""
    t_start = time.perf_counter()
    device, dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
    model, inputs = spec.make(size, point, cfg.seed)
    rec = {"model": spec.name, "family": spec.family, "point": point, "size": size,
           "batch": spec.batch(size, point), "dtype": cfg.dtype,
           "inputs": [f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in inputs],
           "systems": {}}
    ref, rec["reference_error"] = reference(model, inputs, device)
    model, inputs = model.to(device=device, dtype=dtype), cast(inputs, device, dtype)
    with tempfile.TemporaryDirectory(prefix=f"aotc-bench-{spec.name}-") as tmp, torch.no_grad():
        calls = measure_systems(rec["systems"], model, inputs, ref, systems, Path(tmp), cfg)
        time_systems(rec["systems"], calls, device, cfg)
        del calls
    release()
    rec["wall_s"] = time.perf_counter() - t_start
    return rec


def measure_systems(results: dict, model, inputs, ref, systems, workdir: Path, cfg) -> dict:
    """Steps 4-6: build, load, first call and accuracy per system. Returns the working calls."""
    calls, eager_out, deterministic = {}, None, True
    for system in systems:
        if system.name != "eager" and eager_out is None:
            results[system.name] = {"status": Status.SKIPPED, "reason": "eager baseline failed"}
            continue
        res, built, out = attempt(system, model, inputs, workdir / system.name, cfg)
        results[system.name] = res
        if built is None:
            continue
        calls[system.name] = built.call
        if system.name == "eager":
            eager_out = out
            deterministic = eager_deterministic(built.call, out)
            res["status"] = Status.PASS if deterministic else Status.EAGER_NONDETERMINISTIC
        elif not deterministic:
            res["status"] = Status.EAGER_NONDETERMINISTIC
        else:
            verdict = judge(out, eager_out, ref)
            res.update(status=Status.PASS if verdict.ok else Status.FAIL_ACCURACY,
                       error=verdict.error, eager_error=verdict.eager_error)
            if not verdict.ok:
                res["reason"] = verdict.reason
    return calls


def attempt(system: System, model, inputs, workdir: Path, cfg: Config):
    """(result, Built or None, first-call outputs or None) for one system; never raises."""
    workdir.mkdir(parents=True, exist_ok=True)
    res: dict = {"status": Status.FAIL_EXPORT}
    stage = "export"
    try:
        with time_limit(cfg.build_limit_s) as limit, fresh_cache(system, workdir):
            built: Built = system.build(model, inputs, workdir)
            res.update(build_s=built.build_s, load_s=built.load_s,
                       artifact_bytes=built.artifact_bytes)
            stage = "run"
            t0 = time.perf_counter()
            first = built.call()
            sync(inputs)
            res["first_call_s"] = time.perf_counter() - t0
            out = [t.detach().clone() for t in flatten(first)]   # CUDA graphs reuse outputs
    except Exception as e:   # any failure of any system is a result, not a crash
        why = f"timed out after {cfg.build_limit_s:g} s" if limit.expired else describe(e)
        compiling = stage == "export" or system.compiles_on_first_call
        res.update(status=Status.FAIL_EXPORT if compiling else Status.FAIL_RUN, reason=why)
        return res, None, None
    if system.compiles_on_first_call:
        res["build_s"] = res["first_call_s"]
    res["cold_start_s"] = (res.get("load_s") or 0.0) + res["first_call_s"]
    return res, built, out


def eager_deterministic(call, first_out: list) -> bool:
    """Run eager a second time; its outputs must be bitwise equal to the first run's."""
    return identical([t.detach().clone() for t in flatten(call())], first_out)


# --------------------------------------------------------------------------------- timing
def time_systems(results: dict, calls: dict, device: torch.device, cfg: Config) -> None:
    """Step 7: interleaved timing; medians and speedups into `results`."""
    times, failed = interleave(calls, device, cfg)
    for name, why in failed.items():
        results[name].update(status=Status.FAIL_RUN, reason=f"while timing: {why}")
    for name, ts in times.items():
        if ts:
            results[name].update(median_s=statistics.median(ts), p90_s=percentile(ts, 0.9),
                                 min_s=min(ts), reps=len(ts))
    base = results.get("eager", {}).get("median_s")
    for res in results.values():
        if base and res.get("median_s"):
            res["speedup"] = base / res["median_s"]


def interleave(calls: dict, device: torch.device, cfg: Config) -> tuple[dict, dict]:
    """({name: call times in s}, {name: why it failed}) from warm-up then interleaved rounds."""
    live, failed = dict(calls), {}
    for name, fn in list(live.items()):
        try:
            for _ in range(cfg.warmup):
                fn()
            sync_device(device)
        except Exception as e:
            failed[name] = describe(e)
            del live[name]
    times = {name: [] for name in live}
    start, rounds = time.perf_counter(), 0
    while live and rounds < cfg.max_reps and (
            rounds < cfg.min_reps or time.perf_counter() - start < cfg.timing_s):
        names = list(live)
        for name in names[rounds % len(names):] + names[:rounds % len(names)]:
            try:
                t0 = time.perf_counter()
                live[name]()
                sync_device(device)
                times[name].append(time.perf_counter() - t0)
            except Exception as e:
                failed[name] = describe(e)
                del live[name]
        rounds += 1
    return {n: t for n, t in times.items() if n not in failed}, failed


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]


# -------------------------------------------------------------------------------- helpers
def reference(model, inputs: tuple, device: torch.device) -> tuple[list | None, str | None]:
    """(float64 outputs on the CPU, None), or (None, why the float64 run failed)."""
    try:
        m64 = copy.deepcopy(model).to(device=device, dtype=torch.float64)
        with torch.no_grad():
            out = [t.detach().cpu() for t in flatten(m64(*cast(inputs, device, torch.float64)))]
        return out, None
    except Exception as e:
        return None, describe(e)
    finally:
        m64 = None
        release()


def cast(inputs: tuple, device: torch.device, dtype: torch.dtype) -> tuple:
    """Inputs on `device`; floating ones in `dtype`, the others (ids, masks) unchanged."""
    return tuple(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
                 for t in inputs)


def sync(inputs: tuple) -> None:
    sync_device(inputs[0].device if inputs else torch.device("cpu"))


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release() -> None:
    """Free what the last point held: Dynamo's caches, Python garbage, cached GPU memory."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def describe(e: BaseException, limit: int = 600) -> str:
    text = " | ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _Limit:
    expired = False


@contextmanager
def time_limit(seconds: float):
    """Raise TimeoutError in the main thread once `seconds` have passed (best effort: Python
    code is interrupted between bytecodes, a long native call when it returns)."""
    limit = _Limit()
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield limit
        return

    def expire(signum, frame):
        limit.expired = True
        raise TimeoutError(f"over the {seconds:g} s limit")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield limit
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
