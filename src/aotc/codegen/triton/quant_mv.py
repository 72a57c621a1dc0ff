"""Decode products over quantized weights on GPUs: x [M, K] (1 <= M <= 8 rows) times a
quantized linear layer's weight, written by hand as a Triton kernel that streams the small
weights once and dequantizes them in registers.

    int4: packed uint8 [N, K/2] (two weights a byte, the even one low, value = nibble - 8) and
          float32 scales [N, K/G], one per group of G weights of a row (artifact/quant.py)
    int8: int8 [N, K] (fp8: float8_e4m3fn [N, K], sm_89+); its per-channel scales multiply
          the product's columns where the product is read (exporter/quantize.py computes
          (x @ q^T) * s), so the kernel reads no scale

A decode step at a small batch reads each weight once and is bound by the bytes it reads: half
of bf16's for int8, a quarter (plus a float32 scale per group) for int4. Each program owns
BLOCK_N rows of the weight (output columns) and a chunk of K, read in tiles of one contiguous
run of bytes per row (128 bytes for one or two rows of x, 64 above: the tile's products must
stay in registers), so each thread issues 16-byte loads. Per tile, the nibbles are unpacked
with a mask and a shift, multiplied by the even and odd elements of x, summed per group, and
each group's sum scaled once (sum_k q_k s x_k = s sum_k q_k x_k: one multiply per group, not
per weight). Where the column blocks alone are too few programs to keep the memory system busy
(N small against the SMs: 132 on an H100), K is split too: each split stores float32 partial
sums [splits, M, N] which whatever reads the product adds up in a fixed order as it loads them
(codegen/lowering/quantized.py), so a split costs no kernel of its own.

Sizes are static and the grid fixed, so decode replays as one CUDA graph; only Triton builtins
and aotc's prelude helpers are called (codegen/triton/printer.py says why), so Triton's
interpreter runs these kernels too (how CUDA artifacts are tested on a
CPU).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from aotc.codegen.triton.decode_attention import HandKernel, hand_source, pow2

MAX_ROWS = 8
TARGET_PROGRAMS = 528      # about four per SM of an H100 (132 SMs) at 4 warps
MIN_TILES_PER_SPLIT = 2


@dataclass(frozen=True)
class QuantTiles:
    rows: int              # x's rows padded to a power of two
    block_n: int           # weight rows (output columns) per program
    block_k: int           # weights of a row per tile (bytes: block_k / 2 for int4)
    splits: int            # K split over this many programs per column block
    chunk: int             # K elements per split (a multiple of block_k)
    num_warps: int = 4


def plan_quant_tiles(m: int, k: int, n: int, scheme: str, group: int | None, *,
                     run: int | None = None, target: int = TARGET_PROGRAMS) -> QuantTiles:
    """Tiles of one contiguous run of bytes per weight row (`run`: 128 for m <= 2, else 64), a
    multiple of the group; rows per program so a tile's products fit in registers
    (rows * block_n * bytes <= 8192); K split so the programs reach `target`. (The overrides
    are for scripts/gpu_quant_mv.py, which times the alternatives on a GPU.)"""
    rows = pow2(m)
    run = run or (128 if rows <= 2 else 64)
    block_k = run * 2 if scheme == "int4" else run
    if group is not None:
        block_k = max(block_k, group)
    block_k = min(block_k, max(group or 16, pow2(k)))
    block_n = max(8, min(64, 8192 // (rows * (block_k // 2 if scheme == "int4" else block_k))))
    columns = math.ceil(n / block_n)
    most = max(1, k // (MIN_TILES_PER_SPLIT * block_k))
    splits = max(1, min(most, math.ceil(target / columns)))
    chunk = math.ceil(k / splits / block_k) * block_k
    return QuantTiles(rows, block_n, block_k, math.ceil(k / chunk), chunk)


_HEAD = '''
@triton.jit
def {name}({params}):
    pn = tl.program_id(0)
    ps = tl.program_id(1)
    rows = tl.arange(0, {mp})
    cols = pn * {bn} + tl.arange(0, {bn})
    acc = tl.full([{mp}, {bn}], 0.0, tl.float32)
    for k0 in range(0, {chunk}, {bk}):
        kb = ps * {chunk} + k0
'''
_INT4 = '''        js = kb // 2 + tl.arange(0, {bkh})
        p = tl.load({w} + cols[:, None] * {kh} + js[None, :]{wmask})
        lo = (p & 15).to(tl.float32) - 8.0
        hi = (p >> 4).to(tl.float32) - 8.0
        xe = tl.load({x} + rows[:, None] * {k} + 2 * js[None, :]{xmask})
        xo = tl.load({x} + rows[:, None] * {k} + 2 * js[None, :] + 1{xmask})
        d = lo[None, :, :] * xe.to(tl.float32)[:, None, :] + \\
            hi[None, :, :] * xo.to(tl.float32)[:, None, :]
        d = tl.reduce(tl.reshape(d, [{mp}, {bn}, {ngt}, {gh}]), 3, aotc_add)
        gs = kb // {g} + tl.arange(0, {ngt})
        s = tl.load({s} + cols[:, None] * {ng} + gs[None, :]{smask})
        acc += tl.reduce(d * s[None, :, :], 2, aotc_add)
'''
_INT8 = '''        ks = kb + tl.arange(0, {bk})
        q = tl.load({w} + cols[:, None] * {k} + ks[None, :]{wmask}).to(tl.float32)
{wzero}        xt = tl.load({x} + rows[:, None] * {k} + ks[None, :]{xmask})
        acc += tl.reduce(q[None, :, :] * xt.to(tl.float32)[:, None, :], 2, aotc_add)
'''
_BIAS = "    acc += tl.load({b} + cols{cmask}).to(tl.float32)[None, :]\n"
_STORE = "    tl.store({o} + {base}rows[:, None] * {n} + cols[None, :], {value}, mask={omask})\n"


def _and(*parts) -> str:
    return " & ".join(p for p in parts if p) or "None"


def _mask(other, *parts) -> str:
    """A load's mask and value where it is off, or nothing where no part applies."""
    mask = " & ".join(p for p in parts if p)
    return f", mask={mask}, other={other}" if mask else ""


def quant_source(name: str, x: str, w: str, s: str | None, bias: str | None, o: str, *,
                 m: int, k: int, n: int, scheme: str, group: int | None,
                 tiles: QuantTiles) -> str:
    """The kernel's Triton source: with one split it stores the product (+ bias) in o's dtype,
    else float32 partial sums [splits, m, n]."""
    t = tiles
    cm = f"(cols < {n})[:, None]" if n % t.block_n else ""
    rm = f"(rows < {m})[:, None]" if m != t.rows else ""
    kfull = t.chunk * t.splits == k
    if scheme == "int4":
        km = "" if kfull else f"(js < {k // 2})[None, :]"
        ngt = t.block_k // group
        gm = "" if kfull else f"(gs < {k // group})[None, :]"
        body = _INT4.format(w=w, x=x, s=s, k=k, kh=k // 2, bkh=t.block_k // 2, mp=t.rows,
                            bn=t.block_n, g=group, gh=group // 2, ngt=ngt, ng=k // group,
                            wmask=_mask(136, cm, km), xmask=_mask(0.0, rm, km),
                            smask=_mask(0.0, cm, gm))
    else:     # int8 and fp8: one value a byte, converted as loaded
        km = "" if kfull else f"(ks < {k})[None, :]"
        wm = _and(cm, km)    # (no `other`: Triton casts none to fp8; zeroed once loaded)
        body = _INT8.format(w=w, x=x, k=k, bk=t.block_k, xmask=_mask(0.0, rm, km),
                            wmask=f", mask={wm}" if wm != "None" else "",
                            wzero=f"        q = tl.where({wm}, q, 0.0)\n" if wm != "None" else "")
    omask = _and(rm, f"(cols < {n})[None, :]" if cm else "")
    if t.splits == 1:
        tail = _BIAS.format(b=bias, cmask=f", mask=cols < {n}, other=0.0" if cm else "") \
            if bias else ""
        tail += _STORE.format(o=o, base="", n=n, omask=omask,
                              value=f"acc.to({o}.dtype.element_ty)")
    else:
        tail = _STORE.format(o=o, base=f"ps * {m * n} + ", n=n, omask=omask, value="acc")
    params = ", ".join(p for p in (x, w, s, bias if t.splits == 1 else None, o) if p)
    head = _HEAD.format(name=name, params=params, mp=t.rows, bn=t.block_n, chunk=t.chunk,
                        bk=t.block_k)
    return head + body + tail


def quant_mv_kernel(x, w, s, bias, out, scheme: str, group: int | None,
                    tiles: QuantTiles) -> HandKernel:
    """The kernel of x [M, K] times a quantized weight for Buffers x (dense), w (the stored
    values), s (int4: the scales; None for int8) and `out`: with one split, out [M, N]
    (+ bias [N]); else float32 partial sums [splits, M, N], which the readers add up."""
    m, k = (int(d) for d in x.shape)
    n = int(w.shape[0])
    bias = bias if tiles.splits == 1 else None
    ins = tuple(b for b in (x, w, s, bias) if b is not None)

    def make(name, ins, outs):
        text = quant_source(name, x.name, w.name, s.name if s is not None else None,
                            bias.name if bias is not None else None, out.name, m=m, k=k, n=n,
                            scheme=scheme, group=group, tiles=tiles)
        return hand_source(name, text, ins, outs,
                           (math.ceil(n / tiles.block_n), tiles.splits, 1), tiles.num_warps)
    kernel = HandKernel(name="kernel_qmv", prefix=(), ins=ins, outs=(out,), make=make)
    kernel.reasons.append(f"{scheme} product of {m} rows ({math.ceil(n / tiles.block_n)} "
                          f"blocks of {tiles.block_n} weight rows, K in {tiles.splits} splits "
                          f"of {tiles.chunk}, tiles of {tiles.block_k})")
    return kernel
