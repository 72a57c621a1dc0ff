"""Products over quantized weights on CPUs: x [M, K] (float32) times a quantized linear layer's
weight, written by hand as C++ that streams the stored bytes and dequantizes them in registers
(the twin of codegen/triton/quant_mv.py).

    int4: packed uint8 [N, K/2] (two weights a byte, the even one low, value = nibble - 8) and
          float32 scales [N, K/G], one per group of G weights of a row (artifact/quant.py)
    int8: int8 [N, K]; its per-channel scales multiply the product's columns where the product
          is read (exporter/quantize.py computes (x @ q^T) * s), so the kernel reads no scale

Each weight row (an output column) is a dot product along K with every row of x: 16 weights a
vector, converted from int8 (or, for int4, looked up by nibble in a per-group table of
(nibble - 8) * scale at AVX-512, else unpacked with a mask and a shift, converted and each
group's sum scaled once) to float in registers, then multiplied with up to ROW_BLOCK rows of x
held in as many accumulators; for one or two rows, four weight rows at a time, so the
accumulators are independent chains and each vector of x is loaded once for the four. So at a
decode step (1 to 8 rows) the weight is read once, whatever the batch; more rows reread a
block of BLOCK_BYTES of weight rows from the cache, once per ROW_BLOCK rows. Threads (OpenMP,
when the weight is at least PARALLEL_MIN_ELEMENTS bytes) take blocks of output columns.

The vectors are GCC's vector extensions (16 floats, `vector_size(64)`): one zmm register where
the level has AVX-512, two ymm with AVX2, four xmm at the x86-64-v2 baseline, NEON on
aarch64, from the same source compiled per level. No VNNI: its int8 dot products need int8
activations, which would quantize x too and change what the layer computes; weight-only
products keep x in float, and at a decode step the bytes, not the arithmetic, set the time.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from aotc.codegen.cpp.printer import cexpr
from aotc.codegen.cpp.room import ROOM_PARAM, room_check
from aotc.codegen.cpp.work import PARALLEL_MIN_ELEMENTS
from aotc.codegen.scheduler import Kernel
from aotc.codegen.shapes import size_names

PANEL_MIN_ROWS = 48    # from this many rows of x, panels (quant_mm.h's aotc_panels)
PANEL_SLOT_COLS = 64   # columns of the panel slot (quant_mm.h's AOTC_PANEL_COLS at most)
ROW_BLOCK = 8          # rows of x per pass over a weight row (accumulators in registers)
VECTOR = 16            # floats a vector
BLOCK_BYTES = 16384    # weight bytes of the column block a thread takes (stays in L1/L2)

# the vector types and templates the quantized kernels share (guarded: once a translation unit)
HELPERS = (Path(__file__).parent / "quant_mm.h").read_text()


@dataclass
class CppHandKernel(Kernel):
    """A C++ kernel written by hand rather than from loop IR: it reads and writes whole
    buffers (`ins`, `outs`: Buffers) and brings its own source and the size symbols it takes
    (`make(name)` -> (source, sizes)), which the backend puts after `header`
    (codegen/cpp/__init__.py)."""
    ins: tuple = ()
    outs: tuple = ()
    make: object = None
    header: str = HELPERS     # what its source needs before it, once a translation unit

    @property
    def writes(self) -> list:
        return list(self.outs)

    @property
    def reads(self) -> set[str]:
        return {b.name for b in self.ins}

    def cpp_source(self) -> tuple[str, list[str], list[str], list[str]]:
        """(C++ source, buffers read, buffers written, the size symbols it takes as its last
        arguments)."""
        text, sizes = self.make(self.name)
        return text, [b.name for b in self.ins], [b.name for b in self.outs], sizes


def column_block(k: int, scheme: str) -> int:
    """Output columns a thread takes at a time: BLOCK_BYTES of weight rows."""
    row = k // 2 if scheme == "int4" else k
    return max(1, BLOCK_BYTES // max(row, 1))


def rows_of(x):
    """x's rows: an int where static, else the size expression (a prompt's length)."""
    m = x.shape[0]
    return int(m) if getattr(m, "is_Integer", isinstance(m, int)) else m


def scratch_shapes(m, k: int, scheme: str, group: int | None) -> list[tuple]:
    """The float32 scratch slots the kernel needs: the panel (K x PANEL_SLOT_COLS) from
    PANEL_MIN_ROWS rows, int4's prepared x (M x (K + K / G)) below; both where M is a size
    symbol (a prompt's length: the kernel chooses when it runs)."""
    panel, prepared = (k, PANEL_SLOT_COLS), (m, k + k // group) if scheme == "int4" else None
    if not isinstance(m, int):
        return [panel] + ([prepared] if prepared else [])
    if m >= PANEL_MIN_ROWS:
        return [panel]
    return [prepared] if prepared else []


def quant_mm_source(name: str, x, w, s, bias, out, scratch: list, *, m, k: int, n: int,
                    scheme: str, group: int | None) -> tuple[str, list[str]]:
    """The kernel's C++ source and the size symbols it takes: out [m, n] = x [m, k] @
    dequantized w^T (+ bias), `scratch` the buffers of scratch_shapes. m is an int, or a size
    expression the kernel reads as its argument (then both paths are compiled and the rows
    choose one when it runs)."""
    ins = [b for b in (x, w, s, bias) if b is not None]
    outs = [out, *scratch]
    params = [f"const {_ctype(b.dtype)}* __restrict__ {b.name}" for b in ins]
    params += [f"float* __restrict__ {b.name}" for b in outs] + [ROOM_PARAM]
    rows = cexpr(m)
    v = {"x": x.name, "w": w.name, "s": s.name if s is not None else "nullptr",
         "b": bias.name if bias is not None else "nullptr", "o": out.name,
         "m": rows, "k": k, "n": n, "g": group or 0}
    weight_bytes = n * (k // 2 if scheme == "int4" else k)
    threads = weight_bytes >= PARALLEL_MIN_ELEMENTS
    by_panels = [*(["#pragma omp parallel"] if threads else []),
                 "aotc_panels<%(g)s>(%(x)s, %(w)s, %(s)s, %(m)s, %(k)s, %(n)s, %(b)s, %(o)s, "
                 "%(t)s);" % {**v, "t": scratch[0].name if scratch else "nullptr"}]
    prepared = scratch[-1].name if scheme == "int4" and scratch else "nullptr"
    by_rows = _dot_loop({**v, "t": prepared}, scheme, threads and n > column_block(k, scheme),
                        column_block(k, scheme))
    if isinstance(m, int):
        loop = by_panels if m >= PANEL_MIN_ROWS else by_rows
        how = "panels dequantized once" if m >= PANEL_MIN_ROWS else "dequantized in registers"
    else:
        loop = [f"if ({rows} >= {PANEL_MIN_ROWS}) {{", *["    " + ln for ln in by_panels],
                "} else {", *["    " + ln for ln in by_rows], "}"]
        how = f"panels dequantized once from {PANEL_MIN_ROWS} rows, else in registers"
    body = [*room_check([*ins, *outs]), *loop]
    what = f"{scheme}" + (f" per group of {group}" if group else "")
    sizes = size_names("\n".join(body))
    params += [f"int64_t s_{z}" for z in sizes]
    lines = [f"// {name}: {what} product of {rows} rows by [{n}, {k}], {how}",
             f'extern "C" int {name}({", ".join(params)}) {{',
             *["    " + ln for ln in body], "    return 0;", "}"]
    return "\n".join(lines) + "\n", sizes


def _dot_loop(v: dict, scheme: str, threads: bool, cb: int) -> list[str]:
    """Few rows: each weight row streamed once per ROW_BLOCK rows of x, in registers, threads
    taking blocks of `cb` columns; int4 reads x prepared in the scratch slot."""
    prep = ["aotc_q4_prepare<%(g)s>(%(x)s, %(m)s, %(k)s, %(t)s);" % v] if scheme == "int4" else []
    xs = v["t"] if scheme == "int4" else v["x"]
    return [*prep, *(["#pragma omp parallel for schedule(static)"] if threads else []),
            f"for (int64_t c0 = 0; c0 < {v['n']}; c0 += {cb})",
            "    aotc_dot_columns<%(g)s>(%(xs)s, %(w)s, %(s)s, %(m)s, %(k)s, %(n)s, c0, "
            "std::min<int64_t>(c0 + %(cb)s, %(n)s), %(b)s, %(o)s);" % {**v, "cb": cb, "xs": xs}]


def _ctype(dtype) -> str:
    return {torch.float32: "float", torch.int8: "int8_t", torch.uint8: "uint8_t"}[dtype]


def quant_mm_kernel(x, w, s, bias, out, scratch: list, scheme: str,
                    group: int | None) -> CppHandKernel:
    """The kernel of x [M, K] times a quantized weight for Buffers x (dense float32), w (the
    stored values), s (int4: the scales; None for int8), bias [N] or None, out [M, N] and
    the scratch buffers of scratch_shapes; M an int or a size expression."""
    m, k, n = rows_of(x), int(x.shape[1]), int(w.shape[0])
    ins = tuple(b for b in (x, w, s, bias) if b is not None)

    def make(name):
        return quant_mm_source(name, x, w, s, bias, out, scratch, m=m, k=k, n=n,
                               scheme=scheme, group=group)
    outs = (out, *scratch)
    kernel = CppHandKernel(name="kernel_qmm", prefix=(), ins=ins, outs=outs, make=make)
    rows = f"blocks of {column_block(k, scheme)} weight rows, {ROW_BLOCK} rows of x a pass"
    if not isinstance(m, int):
        how = f"panels from {PANEL_MIN_ROWS} rows, else {rows}"
    else:
        how = "panels of weight rows dequantized once" if m >= PANEL_MIN_ROWS else rows
    kernel.reasons.append(f"{scheme} product of {m} rows ({how})")
    return kernel
