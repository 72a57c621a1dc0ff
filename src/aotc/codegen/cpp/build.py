"""Compiling generated C++ into one shared library, at export time only.

The source is split into translation units compiled in parallel and linked; results are cached
by the hash of the sources, flags and compiler version, so re-exporting an unchanged model does
not recompile. Loading an artifact never invokes a compiler.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import ctypes
import functools
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from functools import lru_cache
from pathlib import Path

from aotc.errors import LoweringError, UsageError
from aotc.artifact.isa import LEVELS, arch_of, auto_levels, best_level, host_arch
from aotc.artifact.staging import Staging

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl   # resolved here, not in the forked child


def die_with_parent(parent: int | None = None) -> None:
    """In a compiler's child process, before exec: be killed when the thread that started it
    ends (the export's worker thread, which outlives every compile it runs), so a killed
    export leaves no compiler running; if the parent died before this ran, exit at once."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)

FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-fPIC", "-fno-math-errno", "-fno-trapping-math",
         "-fno-semantic-interposition")


CROSS = {"aarch64": "aarch64-linux-gnu-g++"}    # the cross compiler of each other arch
CROSS_PACKAGE = {"aarch64": "g++-aarch64-linux-gnu"}


def compiler(level: str | None = None) -> str:
    """The C++ compiler that builds for `level` (None: this host): the host's, or for another
    architecture its cross compiler (a UsageError naming it where it is not installed)."""
    arch = arch_of(level) if level is not None else host_arch()
    if arch != host_arch():
        cross = CROSS.get(arch)
        if cross is None or shutil.which(cross) is None:
            raise UsageError(f"building CPU kernels for {level} needs the cross compiler "
                             f"{cross or arch + '-g++'}, which is not installed",
                             where="--isa", expected=f"{cross} on PATH",
                             found="not found", fix=f"install it (e.g. apt-get install "
                             f"{CROSS_PACKAGE.get(arch, 'a cross g++')}), or export with "
                             "--isa auto for this host")
        return cross
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    raise LoweringError("no C++ compiler found to build CPU kernels", where="PATH",
                        expected="g++ or clang++", found="none",
                        fix="install a C++ compiler (e.g. apt-get install g++)")


@lru_cache(maxsize=4)
def compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                         preexec_fn=functools.partial(die_with_parent, os.getpid()))
    return out.stdout.splitlines()[0] if out.stdout else cxx


def resolve_isa(isa: str) -> tuple:
    """The levels `--isa` asks for, lowest first: auto, the baseline up to this host's level
    (artifact/isa.py auto_levels); native, this host's level; a level, exactly that one."""
    if isa == "auto":
        return auto_levels()
    level = best_level() if isa == "native" else isa
    if level not in LEVELS:
        raise UsageError(f"unknown CPU ISA level {isa!r}", where="--isa",
                         expected=["auto", "native", *LEVELS], found=isa,
                         fix="use auto (the baseline up to this host's level) or one level, "
                             "e.g. x86-64-v3")
    compiler(level)     # another architecture: its cross compiler must be installed
    return (level,)


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "aotc" / "cpp"


def build_libraries(units: list[str], levels: tuple) -> dict:
    """Compile C++ translation units into one shared library per level: {level: bytes}. The
    compiles of every level share one pool of one process per core, the links follow."""
    jobs = {level: _Job(units, level) for level in levels}
    todo = [job for job in jobs.values() if not job.cached.is_file()]
    with ExitStack() as stack:
        for job in todo:
            job.tmp = Path(stack.enter_context(Staging("aotc-cc-")))
            for i, src in enumerate(units):
                (job.tmp / f"u{i}.cpp").write_text(src)
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            compiles = [(job, pool.submit(job.run, ["-c", f"u{i}.cpp", "-o", f"u{i}.o"]))
                        for job in todo for i in range(len(units))]
            for job, f in compiles:
                job.check(f.result())
            links = [(job, pool.submit(job.run, ["-shared", *[f"u{i}.o" for i in
                                                              range(len(units))], "-o", "lib.so"]))
                     for job in todo]
            for job, f in links:
                job.check(f.result())
        for job in todo:
            job.store((job.tmp / "lib.so").read_bytes())
    return {level: job.cached.read_bytes() for level, job in jobs.items()}


class _Job:
    """The build of one level's library: its compiler, flags and cache entry."""

    def __init__(self, units: list[str], level: str):
        self.cxx = compiler(level)
        self.flags = [*FLAGS, f"-march={level}"]
        key = hashlib.sha256("\0".join([compiler_version(self.cxx), *self.flags, *units])
                             .encode()).hexdigest()
        self.cached = cache_dir() / f"{key}.so"
        self.tmp: Path | None = None

    def run(self, args: list) -> subprocess.CompletedProcess:
        return subprocess.run([self.cxx, *self.flags, *args], cwd=self.tmp, capture_output=True,
                              text=True, preexec_fn=functools.partial(die_with_parent,
                                                                      os.getpid()))

    def check(self, result: subprocess.CompletedProcess) -> None:
        if result.returncode != 0:
            raise LoweringError("the C++ compiler rejected the generated kernels",
                                where=f"{self.cxx} {' '.join(self.flags)}",
                                expected="a clean compile",
                                found=result.stderr[-3000:] or "a failed compile",
                                fix="report this as an aotc bug with the model; meanwhile "
                                    "export with --no-codegen to use ATen kernels only")

    def store(self, data: bytes) -> None:
        self.cached.parent.mkdir(parents=True, exist_ok=True)
        part = self.cached.with_suffix(f".{os.getpid()}.part")
        part.write_bytes(data)
        os.replace(part, self.cached)
