"""The native kernel library of a CPU artifact: ISA check, loading, and kernel callables.

The library is loaded with ctypes from the artifact directory (never compiled here). Each kernel
is an `extern "C" int name(T* ...)` taking data pointers (inputs, then outputs) and returning
non-zero when an indexing input was out of range.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from aotc.errors import GuardError, TargetError
from aotc.runtime.cpu import host_arch, missing_flags


def check_isa(native: dict) -> None:
    isa = native["isa"]
    arch = "aarch64" if isa.startswith("arm") else "x86_64"
    if arch != host_arch():
        raise TargetError(f"artifact kernels were built for {arch} ({isa}); this host is "
                          f"{host_arch()}", where="manifest target.native.isa",
                          expected=arch, found=host_arch(),
                          fix=f"re-export on a {host_arch()} host, or export with --no-codegen")
    missing = missing_flags(isa)
    if missing:
        raise TargetError(f"artifact kernels need CPU level {isa}; this CPU lacks "
                          f"{', '.join(missing)}", where="manifest target.native.isa",
                          expected=f"a CPU with {isa}", found=f"missing {', '.join(missing)}",
                          fix="re-export with --isa x86-64-v3 (or lower) for this host")


def load_library(path: Path, native: dict) -> ctypes.CDLL:
    check_isa(native)
    return ctypes.CDLL(str(path / native["library"]))


class ThreadCount:
    """Keeps a kernel library's OpenMP threads at torch.get_num_threads() for each thread that
    calls it (OpenMP's thread count is a setting of the calling thread): a server that gives
    torch n threads per worker gets kernels on n threads, not on every core. One comparison per
    call; the library is told only when the count changes."""

    def __init__(self, lib: ctypes.CDLL):
        self.set = lib.aotc_set_num_threads
        self.set.argtypes, self.set.restype = [ctypes.c_int], None
        self.local = threading.local()

    def __call__(self) -> None:
        n = torch.get_num_threads()
        if getattr(self.local, "n", None) != n:
            self.set(n)
            self.local.n = n


def thread_count(lib) -> ThreadCount | None:
    """A ThreadCount for a CPU kernel library that has the setter (libraries of artifacts
    exported before it existed do not: their kernels keep OpenMP's defaults)."""
    if isinstance(lib, ctypes.CDLL) and hasattr(lib, "aotc_set_num_threads"):
        return ThreadCount(lib)
    return None


def kernel(lib: ctypes.CDLL, name: str, nargs: int, nsizes: int = 0):
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_int64] * nsizes
    fn.restype = ctypes.c_int
    return fn


def kernel_failed(name: str) -> None:
    raise GuardError(f"an index input is out of range (kernel {name})", where=f"kernel {name}",
                     expected="indices within the indexed dimension",
                     found="an index out of range",
                     fix="check the values of integer index inputs (e.g. token ids < vocab size)")
