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
from functools import lru_cache
from pathlib import Path

from aotc.errors import LoweringError, UsageError
from aotc.runtime.cpu import LEVELS, best_level, host_arch
from aotc.runtime.staging import Staging

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


def compiler() -> str:
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


def resolve_isa(isa: str) -> str:
    level = best_level() if isa in ("auto", "native") else isa
    if level not in LEVELS:
        raise UsageError(f"unknown CPU ISA level {isa!r}", where="--isa",
                         expected=["auto", *LEVELS], found=isa,
                         fix="use auto (this host's best) or e.g. x86-64-v3 for portable builds")
    if (level == "armv8-a") != (host_arch() == "aarch64"):
        raise UsageError(f"ISA {level} does not match this host ({host_arch()})", where="--isa",
                         expected=f"a level for {host_arch()}", found=level,
                         fix="cross-compiling CPU kernels is not supported; use auto")
    return level


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "aotc" / "cpp"


def build_library(units: list[str], isa: str) -> bytes:
    """Compile C++ translation units for `isa` into one shared library; returns its bytes."""
    cxx = compiler()
    flags = [*FLAGS, f"-march={isa}"]
    key = hashlib.sha256("\0".join([compiler_version(cxx), *flags, *units]).encode()).hexdigest()
    cached = cache_dir() / f"{key}.so"
    if cached.is_file():
        return cached.read_bytes()
    with Staging("aotc-cc-") as tmp:
        objs = []
        for i, src in enumerate(units):
            (Path(tmp) / f"u{i}.cpp").write_text(src)
            objs.append(Path(tmp) / f"u{i}.o")

        def cc(i):
            return subprocess.run([cxx, *flags, "-c", f"u{i}.cpp", "-o", objs[i].name],
                                  cwd=tmp, capture_output=True, text=True,
                                  preexec_fn=functools.partial(die_with_parent, os.getpid()))
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            results = list(pool.map(cc, range(len(units))))
        link = None
        if all(r.returncode == 0 for r in results):
            link = subprocess.run([cxx, *flags, "-shared", *[o.name for o in objs], "-o",
                                   "lib.so"], cwd=tmp, capture_output=True, text=True,
                                  preexec_fn=functools.partial(die_with_parent, os.getpid()))
        failed = next((r for r in [*results, link] if r is None or r.returncode != 0), None)
        if failed is not None:
            err = (failed.stderr if failed is not None else "")[-3000:]
            raise LoweringError("the C++ compiler rejected the generated kernels",
                                where=f"{cxx} {' '.join(flags)}", expected="a clean compile",
                                found=err or "a failed compile",
                                fix="report this as an aotc bug with the model; meanwhile "
                                    "export with --no-codegen to use ATen kernels only")
        data = (Path(tmp) / "lib.so").read_bytes()
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_suffix(f".{os.getpid()}.part")
    part.write_bytes(data)
    os.replace(part, cached)
    return data
