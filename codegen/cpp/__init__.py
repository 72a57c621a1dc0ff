"""The C++/OpenMP backend: Kernels in, one C++ source file and one shared library out."""
from __future__ import annotations

from pathlib import Path

from aotc.codegen.cpp.build import build_library, compiler, compiler_version, resolve_isa
from aotc.codegen.cpp.kernel import kernel_source

PRELUDE = "\n".join((Path(__file__).parent / name).read_text()
                    for name in ("prelude.h", "vecmath.h"))
KERNELS_PER_UNIT = 24

__all__ = ["generate", "resolve_isa", "compiler_description"]


def generate(groups: list, isa: str):
    """Kernels of one or more graphs, given as (kernels, buffers, stored) groups, into one
    library: (source text, library bytes, {kernel name: (buffers read, written, sizes)})."""
    bodies, signatures = [], {}
    for kernels, buffers, stored in groups:
        for k in kernels:
            src, ins, outs, sizes = kernel_source(k, buffers, stored)
            bodies.append(src)
            signatures[k.name] = (ins, outs, sizes)
    header = f"// aotc generated kernels: {len(bodies)} kernels, built for -march={isa}\n"
    source = header + PRELUDE + "\n" + "\n".join(bodies)
    units = [PRELUDE + "\n" + "\n".join(bodies[i:i + KERNELS_PER_UNIT])
             for i in range(0, len(bodies), KERNELS_PER_UNIT)]
    return source, build_library(units, isa), signatures


def compiler_description() -> str:
    return compiler_version(compiler())
