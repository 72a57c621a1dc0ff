"""One adapter per system under test. Each turns (model, inputs) into a zero-argument call.

`System.build(model, inputs, workdir)` does the system's ahead-of-time work and returns a `Built`:

  system                   build (timed as build_s)                 load (load_s)
  eager                    nothing                                  -
  torch.compile            torch.compile(model, mode=...) (lazy)    -
  aotinductor              torch.export + aoti_compile_and_package  aoti_load_package
  aotc                     aotc.export                              aotc.load

Calls are what a user writes: `model(*inputs)`, `compiled(*inputs)`, `runner(*inputs)`, and for
aotc `module(*inputs)` (guards checked, output structure rebuilt).

The harness then times the first call (first_call_s). torch.compile compiles inside its first
call, so for it first_call_s *is* the compile time and the cold start; the harness records it as
its build_s too. The harness builds Inductor-based systems and makes their first call inside
`fresh_cache()`, so no system reuses kernels another one compiled (every cold start is cold),
and `warm_up()` pays Inductor's one-time import cost before anything is measured, so the first
model is not charged for it. aotc builds with its kernel cache pointed at an empty folder too.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(kw_only=True, slots=True)
class Built:
    call: Callable[[], object]          # runs the model once on the benchmark inputs
    build_s: float | None = None        # export / compile time, ahead of the first call
    load_s: float | None = None         # artifact load time
    artifact_bytes: int | None = None   # size on disk of what a deployment ships


class System:
    name = ""
    compiles_on_first_call = False
    uses_inductor = False     # build and first call run in a fresh Inductor cache
    cache_env: str | None = None   # environment variable naming the system's own cache folder

    def available(self, device: torch.device) -> str | None:
        """None if the system can run on `device`, else why not."""
        return None

    def build(self, model, inputs: tuple, workdir: Path) -> Built:
        raise NotImplementedError


class Eager(System):
    name = "eager"

    def build(self, model, inputs, workdir):
        return Built(call=lambda: model(*inputs))


class TorchCompile(System):
    compiles_on_first_call = True
    uses_inductor = True

    def __init__(self, mode: str = "default"):
        self.mode = mode
        self.name = "torch.compile" if mode == "default" else f"torch.compile:{mode}"

    def available(self, device):
        if self.mode == "reduce-overhead" and device.type != "cuda":
            return "CUDA graphs need a CUDA device"
        return None

    def build(self, model, inputs, workdir):
        compiled = torch.compile(model, mode=None if self.mode == "default" else self.mode)
        return Built(call=lambda: compiled(*inputs))


class AOTInductor(System):
    name = "aotinductor"
    uses_inductor = True

    def build(self, model, inputs, workdir):
        t0 = time.perf_counter()
        ep = torch.export.export(model, inputs)
        package = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(workdir / "model.pt2"))
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        runner = torch._inductor.aoti_load_package(package)
        load_s = time.perf_counter() - t0
        return Built(call=lambda: runner(*inputs), build_s=build_s, load_s=load_s,
                     artifact_bytes=Path(package).stat().st_size)


class Aotc(System):
    """aotc with its default plan runner (the C++ one where installed), or with `runner`."""
    cache_env = "XDG_CACHE_HOME"   # aotc keeps compiled kernels under $XDG_CACHE_HOME/aotc

    def __init__(self, runner: str | None = None, isa: str | None = None,
                 prebuilt: Path | None = None):
        """`isa`: load the kernels of that CPU level (the export builds every level, as
        `--isa auto` does) instead of the best this CPU has. `prebuilt`: a folder that
        benchmarks/prebuild.py fills; the artifact is loaded from there (waiting for it)
        instead of exported here."""
        self.runner, self.isa, self.prebuilt = runner, isa, prebuilt
        self.name = "aotc" if runner is None and isa is None else f"aotc:{runner or isa}"

    def available(self, device):
        from aotc.artifact.isa import supported
        if self.isa is not None and (device.type != "cpu" or not supported(self.isa)):
            return f"kernels for {self.isa} do not run on this {device.type} host"
        return None

    def build(self, model, inputs, workdir):
        import aotc
        device = inputs[0].device if inputs else torch.device("cpu")
        if self.prebuilt is not None:
            path, build_s = wait_for_artifact(self.prebuilt, point_key(model, inputs))
        else:
            t0 = time.perf_counter()
            path = aotc.export(model, inputs, workdir / "model.aotc", target=device.type)
            build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        module = aotc.load(path, device=device, runner=self.runner, isa=self.isa)
        load_s = time.perf_counter() - t0
        return Built(call=lambda: module(*inputs), build_s=build_s, load_s=load_s,
                     artifact_bytes=directory_bytes(path))


def point_key(model, inputs: tuple) -> str:
    """What names a benchmark point's prebuilt artifact: a digest of the model's class, its
    parameter count and the inputs' shapes and dtypes (the same on the CPU and the GPU)."""
    import hashlib
    text = repr((type(model).__qualname__, sum(p.numel() for p in model.parameters()),
                 [(tuple(t.shape), str(t.dtype)) for t in inputs]))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def wait_for_artifact(folder: Path, key: str, poll_s: float = 0.5) -> tuple[Path, float]:
    """(artifact path, its export seconds) once benchmarks/prebuild.py has recorded it; its
    export error raised as RuntimeError. Waits without a limit of its own: the harness's build
    limit interrupts it."""
    import json
    record = Path(folder) / f"{key}.json"
    while not record.exists():
        time.sleep(poll_s)
    done = json.loads(record.read_text())
    if "error" in done:
        raise RuntimeError(f"prebuilt export failed: {done['error']}")
    return Path(folder) / f"{key}.aotc", done["export_s"]


SYSTEMS: dict[str, System] = {s.name: s for s in (
    Eager(), TorchCompile(), TorchCompile("reduce-overhead"), AOTInductor(), Aotc(),
    Aotc("python"), Aotc("cpp"), Aotc(isa="x86-64-v2"), Aotc(isa="x86-64-v3"))}
ON_REQUEST = {"aotc:cpp", "aotc:x86-64-v2", "aotc:x86-64-v3"}   # run only when named


def select(names: list[str] | None, device: torch.device) -> tuple[list[System], dict[str, str]]:
    """(systems to run, {name: why skipped}); eager always runs first, as the baseline. The
    aotc:<level> systems (one CPU level's kernels) and aotc:cpp (the C++ runner, which
    artifacts get by default where it is installed) run only when named."""
    unknown = sorted(set(names or ()) - set(SYSTEMS))
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    default = [n for n in SYSTEMS if n not in ON_REQUEST]
    chosen = ["eager"] + [n for n in (names or default) if n != "eager"]
    skipped = {n: why for n in chosen if (why := SYSTEMS[n].available(device))}
    return [SYSTEMS[n] for n in chosen if n not in skipped], skipped


def warm_up(systems: list[System], device: torch.device) -> None:
    """Pay Inductor's one-time import and worker start-up before anything is timed."""
    if any(isinstance(s, (TorchCompile, AOTInductor)) for s in systems):
        torch._dynamo.reset()
        torch.compile(lambda x: torch.relu(x) + 1)(torch.randn(4, device=device))
        torch._dynamo.reset()


@contextmanager
def fresh_cache(system: System, workdir: Path):
    """Build with empty caches, so build times are cold: for Inductor-based systems, Inductor's
    in-memory caches emptied and its on-disk cache a new folder under `workdir`; for systems
    naming a `cache_env`, that variable pointed at a new folder under `workdir`."""
    with ExitStack() as stack:
        if system.uses_inductor:
            from torch._inductor import utils   # fresh_inductor_cache before torch 2.8
            fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache
            stack.enter_context(fresh(dir=str(workdir), delete=False))
        if system.cache_env:
            stack.enter_context(environment(system.cache_env, str(workdir / "cache")))
        yield


@contextmanager
def environment(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
