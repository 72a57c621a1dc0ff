"""CPU instruction-set levels: what a kernel library was built for, and whether this host has it.

Shared by codegen (which picks a level and compiles for it) and the runtime (which refuses a
library whose level this CPU lacks, before loading it).
"""
from __future__ import annotations

import platform
from functools import lru_cache

# x86-64 micro-architecture levels (as GCC's -march names them) and the CPU flags each needs.
LEVELS = {
    "x86-64": (),
    "x86-64-v2": ("sse4_2", "popcnt", "ssse3"),
    "x86-64-v3": ("sse4_2", "popcnt", "avx", "avx2", "fma", "bmi2", "f16c", "movbe"),
    "x86-64-v4": ("sse4_2", "popcnt", "avx", "avx2", "fma", "bmi2", "f16c", "movbe",
                  "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    "armv8-a": (),
}
ORDER = tuple(LEVELS)            # lowest first, per architecture
BASELINE = "x86-64-v2"           # the lowest level `--isa auto` builds for on x86-64


def arch_of(level: str) -> str:
    return "aarch64" if level.startswith("arm") else "x86_64"


def supported(level: str) -> bool:
    """Whether this host can run code built for `level`."""
    return arch_of(level) == host_arch() and not missing_flags(level)


def auto_levels() -> tuple:
    """The levels `--isa auto` builds: the x86-64-v2 baseline and each level above it up to
    this host's best (just the host's level where it is below the baseline, or on aarch64)."""
    best = best_level()
    if best not in ORDER[ORDER.index(BASELINE):ORDER.index("x86-64-v4") + 1]:
        return (best,)
    return ORDER[ORDER.index(BASELINE):ORDER.index(best) + 1]


@lru_cache(maxsize=1)
def host_flags() -> frozenset:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_arch() -> str:
    m = platform.machine().lower()
    return "aarch64" if m in ("aarch64", "arm64") else m


def best_level() -> str:
    if host_arch() == "aarch64":
        return "armv8-a"
    flags = host_flags()
    for level in ("x86-64-v4", "x86-64-v3", "x86-64-v2"):
        if set(LEVELS[level]) <= flags:
            return level
    return "x86-64"


def missing_flags(level: str) -> list[str]:
    return sorted(set(LEVELS.get(level, ())) - host_flags())
