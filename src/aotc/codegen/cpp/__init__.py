"""The C++/OpenMP backend: Kernels in, one C++ source file and one shared library per CPU level
out (`CppBackend`, codegen/backend.py's protocol)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from aotc.artifact import format as fmt
from aotc.codegen.backend import GeneratedKernels, KernelGroup, Lowering, Signature
from aotc.codegen.cpp.build import build_libraries, compiler, compiler_version, resolve_isa
from aotc.codegen.cpp.kernel import kernel_source
from aotc.codegen.cpp.room import ROOM_MARKER
from aotc.codegen.shapes import numbered
from aotc.artifact.dtypes import dtype_name

PRELUDE = "\n".join((Path(__file__).parent / name).read_text()
                    for name in ("prelude.h", "vecmath.h"))
KERNELS_PER_UNIT = 24
# The library's OpenMP threads follow torch's thread count: the runtime sets it per calling
# thread (an OpenMP setting of that thread) whenever torch.get_num_threads() changes.
THREADS_UNIT = """#include <omp.h>
extern "C" void aotc_set_num_threads(int n) { omp_set_num_threads(n); }
extern "C" int aotc_max_threads() { return omp_get_max_threads(); }
"""

__all__ = ["CppBackend", "resolve_isa", "compiler_description"]


class CppBackend:
    """The C++/OpenMP backend (codegen/backend.py's `Backend`): every entry's kernels in one
    source, compiled into one shared library per CPU level of `isa` (build.resolve_isa)."""
    name = "cpp"
    device = "cpu"

    def __init__(self, isa: str = "auto"):
        self.isa = isa

    def lowering(self, inference: bool) -> Lowering:
        # channels-last convolutions (oneDNN's fast layout); SDPA outputs where the export
        # machine's CPU attention puts them; hand-written attention as one SDPA call
        return Lowering(channels_last=inference, sdpa_layout=True, fuse_attention=inference)

    def generate(self, groups: Sequence[KernelGroup]) -> GeneratedKernels:
        """One source and its translation units for the kernels of `groups`. Kernels of one
        shape (the same source but for names, codegen/shapes.py) are one function, under each
        of their names in the table."""
        levels = resolve_isa(self.isa)
        bodies, signatures, entries, shapes, texts = [], {}, [], {}, {}
        for group in groups:
            buffers = group.buffers
            for k in group.kernels:
                src, ins, outs, sizes = kernel_source(k, buffers, group.stored)
                signatures[k.name] = Signature(ins, outs, sizes)
                texts[k.name] = src
                dtypes = ",".join(dtype_name(buffers[n].dtype) for n in (*ins, *outs)) \
                    + ROOM_MARKER
                # a kernel of a shape compiled before (codegen/shapes.py) is that one's function
                first = shapes.setdefault(numbered(src, [k.name, *ins, *outs], "//"), k.name)
                if first == k.name:
                    bodies.append(src)
                entries.append((k.name, _prototype(src, k.name) if first == k.name else None,
                                len(ins) + len(outs), len(sizes), dtypes, first))
        table = THREADS_UNIT + kernel_table(entries)
        header = (f"// aotc generated kernels: {len(entries)} kernels, {len(bodies)} functions "
                  f"(kernels of one shape share one), built for -march={', '.join(levels)}\n")
        # hand-written kernels' shared templates (codegen/cpp/quant_mm.h), once a unit
        prelude = PRELUDE + "".join(sorted({k.header for g in groups for k in g.kernels
                                            if hasattr(k, "header")}))
        source = header + prelude + "\n" + "\n".join(bodies) + "\n" + table
        units = [prelude + "\n" + "\n".join(bodies[i:i + KERNELS_PER_UNIT])
                 for i in range(0, len(bodies), KERNELS_PER_UNIT)] + [table]
        return GeneratedKernels(sources={fmt.KERNEL_SOURCE: source.encode()}, texts=texts,
                                signatures=signatures, work=(tuple(units), levels))

    def build(self, generated: GeneratedKernels) -> dict[str, bytes]:
        units, levels = generated.work
        return {fmt.kernel_library(level): lib
                for level, lib in build_libraries(list(units), levels).items()}

    def native(self, generated: GeneratedKernels) -> dict:
        _, levels = generated.work
        return {"compiler": compiler_description(levels), "source": fmt.KERNEL_SOURCE,
                "libraries": {level: fmt.kernel_library(level) for level in levels},
                "table": True}


def _prototype(src: str, name: str) -> str:
    line = next(ln for ln in src.splitlines() if ln.startswith(f'extern "C" int {name}('))
    return line.rstrip().removesuffix("{").rstrip() + ";"


def kernel_table(entries: list) -> str:
    """The library's table of kernels, the only way the runtime finds them
    (runtime/native.py): name, address, pointer and size argument counts, pointer dtypes
    (then ROOM_MARKER: the kernel takes the room of its pointers, codegen/cpp/room.py). An
    entry (name, prototype, nargs, nsizes, types, function) of a kernel whose shape an earlier
    one has is that one's function, and has no prototype of its own."""
    lines = ["#include <cstdint>",
             "struct aotc_kernel_entry { const char* name; void* fn; int nargs; int nsizes; "
             "const char* types; };"]
    lines += [proto for _, proto, *_ in entries if proto is not None]
    rows = [f'    {{"{name}", (void*)&{fn}, {nargs}, {nsizes}, "{types}"}},'
            for name, _, nargs, nsizes, types, fn in entries]
    lines += ["static const aotc_kernel_entry aotc_kernels[] = {", *rows,
              '    {nullptr, nullptr, 0, 0, nullptr}', "};",
              'extern "C" const aotc_kernel_entry* aotc_kernel_table(int* n) {',
              f"    *n = {len(entries)};", "    return aotc_kernels;", "}"]
    return "\n".join(lines) + "\n"


def compiler_description(levels: tuple) -> str:
    return compiler_version(compiler(levels[0]))
