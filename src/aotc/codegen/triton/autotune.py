"""Autotuning (`--autotune`): block sizes and warps timed on this machine's GPU at export.

The block heuristics (blocks.py) decide from sizes alone. With --autotune, each kernel's
heuristic config and a few neighbours (`candidates`) are compiled, run and timed on the local
GPU, and the fastest is what the artifact is built with, for every target arch:

  * candidates are realized through `plan_blocks`, so configs that clamp to the same blocks
    count once, and none gives a program more than MAX_ELEMENTS elements;
  * every candidate runs once on the heuristic's random inputs; one whose outputs differ from
    the heuristic's (beyond what another summation order rounds to) is dropped: a safety net
    for masking at block sizes the heuristics never choose;
  * timing: CUDA events around a CUDA graph of back-to-back launches (no host time between
    them), replayed until a sample lasts `min_us`; the median of a few samples;
  * the heuristic stays unless another config is at least MIN_GAIN faster: timing noise must
    not churn artifacts.

Kernels run at the sizes the model was exported with (dynamic dims at their example sizes).
Timing needs a GPU that runs one of the target's cubins: without a CUDA GPU (cross-compiling
hosts are normal), or with one of another arch, autotuning is skipped and the reason recorded
in the manifest. Candidates launch through the runtime's driver (runtime/cuda.py): what is
timed is what the runtime would run. Each launch spec records what was timed and chosen.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from aotc.codegen.triton import module_text
from aotc.codegen.triton.blocks import BlockConfig, SizeHints, heuristic_config, plan_blocks
from aotc.codegen.triton.build import code_free_shape, compile_kernels
from aotc.codegen.triton.kernel import KernelSource, kernel_source
from aotc.errors import LoweringError, TargetError
from aotc.exporter.symbols import SymbolNamer
from aotc.runtime.cuda import CudaLauncher, driver, select_arch
from aotc.artifact.schema.launch import Build, Param

MAX_CANDIDATES = 8
MAX_ELEMENTS = 16384            # per program: XBLOCK x its widest R block
RBLOCKS = (16, 8192)            # the range looped and split R blocks are tried in
WARPS = (1, 2, 4, 8, 16)
MIN_GAIN = 0.03                 # a config replaces the heuristic's if at least 3% faster
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2}   # rtol and atol; 1e-2 otherwise


def candidates(kernel, buffers: dict, hints=None) -> list[BlockConfig]:
    """The heuristic's config, then its neighbours (XBLOCK halved, doubled, quadrupled; the
    looped or split R block, or an outer reduction's, halved and doubled; warps halved and
    doubled; then a few changes of two at once), each as the config it plans to: distinct, in
    this fixed order, at most MAX_CANDIDATES. `hints`: blocks.SizeHints."""
    h = heuristic_config(plan_blocks(kernel, buffers, hints=hints))
    x, r, w = h.xblock, h.rblock, h.num_warps
    tries = [dict(xblock=x // 2), dict(xblock=x * 2)]
    if r is not None:
        tries += [dict(rblock=r // 2), dict(rblock=r * 2)]
    tries += [dict(num_warps=w // 2), dict(num_warps=w * 2), dict(xblock=x * 4),
              dict(xblock=x * 2, num_warps=w * 2), dict(xblock=x // 2, num_warps=w // 2)]
    if r is not None:
        tries += [dict(rblock=r * 2, num_warps=w * 2), dict(rblock=r // 2, xblock=x * 2)]
    out = [h]
    for t in tries:
        if (t.get("xblock", 1) < 1 or t.get("num_warps", 1) not in WARPS
                or not RBLOCKS[0] <= t.get("rblock", RBLOCKS[0]) <= RBLOCKS[1]):
            continue
        blocks = plan_blocks(kernel, buffers, dataclasses.replace(h, **t), hints)
        config = heuristic_config(blocks)
        if config not in out and blocks.xblock * blocks.widest <= MAX_ELEMENTS:
            out.append(config)
        if len(out) == MAX_CANDIDATES:
            break
    return out


def local_tuner(archs: list[str], hints: SizeHints) -> tuple[Tuner | None, str | None]:
    """(a Tuner on this machine's GPU, None), or (None, why autotuning is skipped): the
    reason is also printed as a one-line warning on stderr."""
    if not torch.cuda.is_available():
        return _skip("this machine has no CUDA GPU; kernels keep the heuristic block sizes")
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    local = f"sm_{major}{minor}"
    try:
        arch = select_arch(archs, local)
    except TargetError:
        return _skip(f"this machine's GPU is {local}, which runs no cubin of the target "
                     f"({', '.join(archs)}); kernels keep the heuristic block sizes")
    return Tuner(torch.device("cuda", index), arch, hints.example, maximum=hints.maximum), None


def _skip(reason: str) -> tuple[None, str]:
    print(f"aotc: warning: --autotune skipped: {reason}", file=sys.stderr)
    return None, reason


class Tuner:
    """Chooses each kernel's block config by running and timing candidates on one device.

    `load(ks, text, cubin, meta)` turns a compiled candidate into a launcher, called as
    `launch(grid, *args)`; `timer(fn)` gives the microseconds one call of `fn` (one launch)
    takes; `build(jobs)` compiles, as `compile_kernels`. Loading and timing default to the GPU
    `device` (CudaLoader, GraphTimer); tests replace them to run candidates with Triton's
    interpreter on the CPU."""

    def __init__(self, device, arch: str, sizes: dict, *, load=None, timer=None,
                 build=compile_kernels, min_gain: float = MIN_GAIN, maximum: dict | None = None):
        """`sizes`: the size symbols' example sizes, which candidates run at; `maximum`: their
        declared maxima (blocks.SizeHints)."""
        self.device, self.arch, self.sizes = torch.device(device), arch, dict(sizes)
        self.hints = SizeHints(self.sizes, dict(maximum or {}))
        self.load = load or CudaLoader(self.device)
        self.timer = timer or GraphTimer(self.device)
        self.build, self.min_gain = build, min_gain
        self.records: dict = {}          # kernel name -> what `tune` recorded
        self.seconds = 0.0

    def tune(self, kernels: list, buffers: dict, stored: set, first_code: int = 1) -> dict:
        """{kernel name: (chosen BlockConfig, record)} for `kernels`, whose error codes count
        from `first_code` as `generate` numbers them. The candidates of all kernels compile
        at once, in parallel, each under a name of its own (`<kernel>_c<j>`, which tells
        candidates apart in records and tests): these cubins are only timed, never shipped;
        `generate` builds the chosen config under the kernel's name. Kernels of one shape
        (build.code_free_shape) are tuned once: the others take the first one's choice."""
        start = time.perf_counter()
        tried, same, shapes = {}, {}, {}
        for i, k in enumerate(kernels):
            if hasattr(k, "source"):    # written by hand: its blocks are its own
                continue
            configs = candidates(k, buffers, self.hints)
            at = (k, buffers, stored, first_code + i)
            sources = [self._source(*at, 0, configs[0])]   # the heuristic's: a kernel of a
            shape = code_free_shape(sources[0])   # shape tuned here already (a decoder's
            if shape in shapes:                   # layers) takes that one's choice
                same[k.name] = shapes[shape]
                continue
            shapes[shape] = k.name
            sources += [self._source(*at, j, c) for j, c in enumerate(configs) if j]
            tried[k.name] = [(c, ks, module_text(ks)) for c, ks in zip(configs, sources)]
        jobs = [(ks, text, self.arch) for cands in tried.values() if len(cands) > 1
                for _, ks, text in cands]
        builds = iter(self._build(jobs))
        out = {}
        for name, cands in tried.items():
            h = cands[0][0]
            if len(cands) == 1:
                record = {"chosen": h.to_json(), "heuristic": h.to_json(),
                          "skipped": "no other candidate"}
                out[name] = (h, record)
            else:
                out[name] = self._choose(cands, [next(builds) for _ in cands], buffers)
            self.records[name] = out[name][1]
        for name, first in same.items():
            chosen, record = out[first]
            out[name] = (chosen, {"chosen": record["chosen"], "heuristic": record["heuristic"],
                                  "skipped": f"the shape of {first}, tuned there"})
            self.records[name] = out[name][1]
        self.seconds += time.perf_counter() - start
        return out

    def _source(self, k, buffers: dict, stored: set, code: int, j: int, config):
        """Candidate j of kernel `k`: its source with `config`, named `<kernel>_c<j>`."""
        return kernel_source(dataclasses.replace(k, name=f"{k.name}_c{j}"), buffers, stored,
                             code, config, self.hints)

    def summary(self) -> dict:
        """The manifest's account of the tuning (target.native.autotune)."""
        timed = [r for r in self.records.values() if "heuristic_us" in r]
        name = (torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
                else str(self.device))
        out = {"device": name, "arch": self.arch, "kernels": len(self.records),
               "tuned": len(timed), "changed": sum(r["chosen"] != r["heuristic"] for r in timed),
               "rejected": sum("rejected" in c for r in timed for c in r["candidates"]),
               "time_s": round(self.seconds, 2),
               "heuristic_us_total": round(sum(r["heuristic_us"] for r in timed), 3),
               "chosen_us_total": round(sum(r["chosen_us"] for r in timed), 3)}
        if self.sizes:
            out["sizes"] = self.sizes
        return out

    def _build(self, jobs: list) -> list:
        """[(cubin, metadata) or the LoweringError] for each job: a candidate that does not
        compile is dropped, not the export (a heuristic's failure surfaces in `_choose`)."""
        if not jobs:
            return []
        try:
            return self.build(jobs)
        except LoweringError:
            out = []
            for job in jobs:
                try:
                    out += self.build([job])
                except LoweringError as e:
                    out.append(e)
            return out

    def _choose(self, cands: list, builds: list, buffers: dict) -> tuple[BlockConfig, dict]:
        """(chosen config, record) of one kernel from its candidates, (config, source, text)
        with the heuristic's first, and their builds. The heuristic must compile, load and
        launch (the artifact ships it otherwise); any other candidate that fails is rejected."""
        rows = [{"config": c.to_json(), "us": None} for c, _, _ in cands]
        launchers = []
        for (_, ks, text), build, row in zip(cands, builds, rows):
            launchers.append(None)
            if isinstance(build, LoweringError):
                if row is rows[0]:
                    raise build
                row["rejected"] = f"does not compile: {build.what.splitlines()[0][:300]}"
                continue
            try:
                launchers[-1] = self.load(ks, text, *build)
            except RuntimeError as e:   # the driver refused it (shared memory, ...)
                if row is rows[0]:
                    raise
                row["rejected"] = f"does not load: {e}"
        generator = torch.Generator(device=self.device).manual_seed(0)
        inputs = {}      # buffer name -> tensor: every run reads the same (kernels never write them)
        want = self._run(cands[0][1], launchers[0], buffers, inputs, generator)
        for (_, ks, _), launch, row in zip(cands[1:], launchers[1:], rows[1:]):
            if launch is None:
                continue
            try:
                got = self._run(ks, launch, buffers, inputs, generator)
            except RuntimeError as e:   # launch refused (too many resources, ...)
                row["rejected"] = f"does not launch: {e}"
                continue
            why = _mismatch(got, want)
            if why is not None:
                row["rejected"] = why
        for (_, ks, _), launch, row in zip(cands, launchers, rows):
            if "rejected" not in row:
                grid, args, _ = self._arguments(ks, buffers, inputs, generator)
                row["us"] = round(self.timer(functools.partial(launch, grid, *args)), 3)
        h_us = rows[0]["us"]
        best_us, best = min((row["us"], j) for j, row in enumerate(rows) if row["us"] is not None)
        chosen = best if best_us <= h_us * (1 - self.min_gain) else 0
        record = {"chosen": rows[chosen]["config"], "heuristic": rows[0]["config"],
                  "heuristic_us": h_us, "best_us": best_us, "chosen_us": rows[chosen]["us"],
                  "candidates": rows}
        return cands[chosen][0], record

    def _run(self, ks: KernelSource, launch, buffers: dict, inputs: dict, generator) -> dict:
        """One launch on fresh outputs: {output name (and aotc_err): tensor}."""
        grid, args, outs = self._arguments(ks, buffers, inputs, generator)
        launch(grid, *args)
        return outs

    def _arguments(self, ks: KernelSource, buffers: dict, inputs: dict, generator):
        """(grid, arguments in parameter order, {written tensor name: tensor}) for one launch
        of `ks`: inputs from `inputs` (made on first use), outputs and the error flag new."""
        args, outs = [], {}
        for name in ks.signature:
            if name in ks.ins:
                if name not in inputs:
                    inputs[name] = _tensor(buffers[name], self.sizes, self.device, generator)
                args.append(inputs[name])
            elif name in ks.outs:
                outs[name] = _tensor(buffers[name], self.sizes, self.device)
                args.append(outs[name])
            elif name == "aotc_err":
                outs[name] = torch.zeros(1, dtype=torch.int32, device=self.device)
                args.append(outs[name])
            else:   # s_<symbol>: a dim size
                args.append(self.sizes[name.removeprefix("s_")])
        return tuple(_evaluate(g, self.sizes) for g in ks.grid), args, outs


def _evaluate(expr, sizes: dict) -> int:
    """An integer size expression (sympy, or Python source over symbol names) at `sizes`."""
    text = expr if isinstance(expr, str) else SymbolNamer().expr(expr)
    return int(eval(text, {"__builtins__": {}, "min": min, "max": max}, dict(sizes)))  # noqa: S307


def _tensor(buf, sizes: dict, device: torch.device, generator=None) -> torch.Tensor:
    """A tensor with `buf`'s shape, strides and dtype at `sizes`, on storage that holds the
    strided layout. With a generator, an input: floats N(0, 0.25), integers 0 (valid indices),
    bool False. Without, an output filled with what no kernel here computes (NaN, the integer
    maximum, True), so an element a candidate leaves unwritten shows as a difference."""
    shape = [_evaluate(d, sizes) for d in buf.shape]
    stride = [_evaluate(d, sizes) for d in buf.stride]
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    dtype = buf.dtype
    if generator is None:
        fill = (math.nan if dtype.is_floating_point else True if dtype == torch.bool
                else torch.iinfo(dtype).max)
        data = torch.full((extent,), fill, dtype=dtype, device=device)
    elif dtype.is_floating_point:
        data = (torch.randn(extent, generator=generator, device=device) * 0.5).to(dtype)
    else:
        data = torch.zeros(extent, dtype=dtype, device=device)
    return data.as_strided(shape, stride)


def _mismatch(got: dict, want: dict) -> str | None:
    """Why a candidate's outputs are not the heuristic's, or None."""
    for name, b in want.items():
        a = got[name]
        if a.dtype.is_floating_point:
            tol = TOLERANCE.get(a.dtype, 1e-2)
            bad = ~torch.isclose(a.float(), b.float(), rtol=tol, atol=tol, equal_nan=True)
        else:
            bad = a != b
        n = int(bad.sum())
        if n and name == "aotc_err":
            return "sets the error flag where the heuristic does not, or not where it does"
        if n:
            return f"differs from the heuristic's {name} in {n} of {b.numel()} elements"
    return None


class CudaLoader:
    """Loads compiled candidates on a GPU with the runtime's driver, as `CudaLauncher`s (the
    runtime's own launcher; of its owner it reads `device` and `context`, as held here)."""

    def __init__(self, device: torch.device):
        torch.cuda.init()
        self.device = device
        self.context = driver().primary_context(device.index)

    def __call__(self, ks: KernelSource, text: str, cubin: bytes, meta: dict) -> CudaLauncher:
        driver().make_current(self.context)
        module, fn = driver().function(cubin, meta["symbol"], meta["shared"])
        return CudaLauncher(ks.name, fn, module, candidate_build(meta),
                            SimpleNamespace(inputs=tuple(ks.ins)), self)


def candidate_build(meta: dict) -> Build:
    """The runtime's typed `Build` of a candidate's launch metadata (build.launch_metadata:
    what an artifact's launch spec would record for it, before any file holds the cubin)."""
    return Build(cubin="", symbol=meta["symbol"], shared=meta["shared"],
                 num_warps=meta["num_warps"], num_ctas=meta.get("num_ctas", 1),
                 params=tuple(Param(**p) for p in meta["params"]), pdl=meta.get("pdl", False))


class GraphTimer:
    """Microseconds per call of `fn` (one launch) on a GPU: `launches` calls captured back to
    back in a CUDA graph, so no host time separates them (plain calls where a capture fails),
    replayed between CUDA events as often as a sample needs to last `min_us`; the median of
    `samples` samples, after `warmup` plain calls."""

    def __init__(self, device: torch.device, *, launches: int = 10, samples: int = 5,
                 warmup: int = 3, min_us: float = 200.0):
        self.device, self.launches, self.samples = device, launches, samples
        self.warmup, self.min_us = warmup, min_us

    def __call__(self, fn) -> float:
        with torch.cuda.device(self.device):
            for _ in range(self.warmup):
                fn()
            torch.cuda.synchronize()
            run = self._capture(fn)
            once = _elapsed_us(run, 1)
            reps = min(1000, max(1, math.ceil(self.min_us / max(once, 1e-3))))
            return statistics.median([_elapsed_us(run, reps) / (reps * self.launches)
                                      for _ in range(self.samples)])

    def _capture(self, fn):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(self.launches):
                    fn()
        except RuntimeError:
            def plain():
                for _ in range(self.launches):
                    fn()
            return plain
        return graph.replay


def _elapsed_us(run, times: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(times):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3
