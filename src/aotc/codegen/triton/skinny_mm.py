"""Products of a few rows on GPUs: `mm` / `addmm` of x [M, K] (2 <= M <= 16) by a weight
[K, N], written by hand as a Triton kernel that streams the weight once.

A decode step at batch 8 multiplies 8 rows by every weight. Like a product of one row
(codegen/lowering/matvec.py) it is bound by reading the weight, and cuBLAS's kernels for it
reach a third to two thirds of the device's copy rate (H200, weights rotated past L2:
scripts/gpu_skinny_mm.py). Each program here owns a block of output columns and loops over
its share of K, multiplying tiles on tensor cores with float32 sums, in one of two forms:

* "swap": the weight's [BLOCK_N, BLOCK_K] tile on the left, x^T [BLOCK_K, 16] on the right
  (x's rows padded with zeros to the product's 16). The weight, the big operand, takes the
  product's long side; this measured 1.3-1.9x cuBLAS on products of up to a few million
  weights (the projections of LLaMA-1B's attention, all of GPT-2's);
* "rows": x [16, BLOCK_K] on the left, the weight's [BLOCK_K, BLOCK_N] tile on the right, which
  measured faster on the larger ones (LLaMA-1B's MLP: 1.05-1.2x cuBLAS).

Where the column blocks alone give too few programs to keep the device's memory busy, K is
split too: each split stores its float32 partial sums, and whatever reads the product adds
them up (with the bias) as it loads it, in a fixed order (the result does not depend on which
program finishes first, as with atomics), so a split costs no kernel of its own.

The weight may have any strides (an nn.Linear weight [N, K] reaches the product as its
permuted view, GPT-2's Conv1D weights are stored transposed on GPUs: codegen/gpu_layouts.py);
the tile loads follow them. Sizes are static and the grid is fixed, so decode replays as one
CUDA graph. Only Triton builtins are called (codegen/triton/printer.py says why), so the
interpreter runs these kernels too (runtime/interpret.py mends its bf16 `tl.dot`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from aotc.codegen.triton.decode_attention import HandKernel, hand_source, pow2

MAX_ROWS = 16
ROWS = 16                  # x's rows padded to a tensor-core product's
SWAP_MAX_WEIGHTS = 8 << 20  # "swap" up to this many weights, "rows" above


@dataclass(frozen=True)
class Tiles:
    form: str              # "swap" or "rows"
    block_n: int
    block_k: int
    splits: int            # K split over this many programs per column block
    chunk: int             # K elements per split (a multiple of block_k)
    num_warps: int = 4
    num_stages: int = 4


def plan_tiles(k: int, n: int, form: str | None = None, *, block_n: int = 64,
               block_k: int | None = None, target: int | None = None) -> Tiles:
    """The form, and column blocks of `block_n`; K split so that the programs reach `target`
    (264 for "swap", about two per SM of an H100/H200; 528 for "rows"), each split at least
    four K blocks long. (The defaults are what scripts/gpu_skinny_mm.py measured best.)"""
    form = form or ("swap" if k * n <= SWAP_MAX_WEIGHTS else "rows")
    block_k = block_k or (64 if form == "swap" else 128)
    target = target or (264 if form == "swap" else 528)
    block_k = min(block_k, max(16, pow2(k)))
    columns = math.ceil(n / block_n)
    most = max(1, k // (4 * block_k))
    splits = max(1, min(most, math.ceil(target / columns)))
    chunk = math.ceil(k / splits / block_k) * block_k
    return Tiles(form, block_n, block_k, math.ceil(k / chunk), chunk)


_PRODUCT = '''
@triton.jit
def {name}({x}, {w}{bias_param}, {o}):
    pn = tl.program_id(0)
    ps = tl.program_id(1)
    rows = tl.arange(0, {mp})
    cols = pn * {bn} + tl.arange(0, {bn})
    acc = tl.full({acc_shape}, 0.0, tl.float32)
    for k0 in range(0, {chunk}, {bk}):
        ks = ps * {chunk} + k0 + tl.arange(0, {bk})
{tiles}
{epilogue}'''
_ROWS = '''        xt = tl.load({x} + rows[:, None] * {k} + ks[None, :]{xmask})
        wt = tl.load({w} + ks[:, None] * {swk} + cols[None, :] * {swn}{wmask}){wcast}
        acc += tl.dot(xt, wt)'''
_SWAP = '''        wt = tl.load({w} + cols[:, None] * {swn} + ks[None, :] * {swk}{wmask}){wcast}
        xt = tl.load({x} + rows[None, :] * {k} + ks[:, None]{xmask})
        acc += tl.dot(wt, xt)'''
_BIAS = "    acc += tl.load({b} + cols{cmask}).to(tl.float32){at}\n"
_STORE = "    tl.store({o} + {where}, {value}, mask={omask})\n"


def _masks(m: int, k: int, n: int, t: Tiles) -> dict:
    """The load and store masks of either form (index order: "rows" tiles are [rows, cols],
    [ks, cols]; "swap" tiles are [cols, ks], [ks, rows]), each left out where the sizes make
    it always true."""
    rmask, cmask = f"(rows < {m})", (f"(cols < {n})" if n % t.block_n else "")
    kmask = "" if t.chunk * t.splits == k else f"(ks < {k})"

    def both(a, b):
        parts = [f"{a}[:, None]" if a else "", f"{b}[None, :]" if b else ""]
        return " & ".join(p for p in parts if p)
    if t.form == "rows":
        xm, wm, om = both(rmask, kmask), both(kmask, cmask), both(rmask, cmask)
    else:
        xm, wm, om = both(kmask, rmask), both(cmask, kmask), both(cmask, rmask)
    return {"xmask": f", mask={xm}, other=0.0" if xm else "",
            "wmask": f", mask={wm}, other=0.0" if wm else "", "omask": om,
            "cmask": f", mask={cmask}, other=0.0" if cmask else ""}


def product_source(name: str, x: str, w: str, bias: str | None, o: str, *, m: int, k: int,
                   n: int, strides: tuple, tiles: Tiles, widen: bool = False) -> str:
    """The Triton source of the product kernel: with one split it stores x @ w (+ bias) in
    o's dtype, else float32 partial sums [splits, m, n]. `widen`: w holds int8 values (a
    quantized layer's), converted to x's dtype as they are loaded."""
    t, masks = tiles, _masks(m, k, n, tiles)
    rows_form = t.form == "rows"
    at = "[None, :]" if rows_form else "[:, None]"
    where = "rows[:, None] * {n} + cols[None, :]" if rows_form else \
        "rows[None, :] * {n} + cols[:, None]"
    if t.splits == 1:
        add = _BIAS.format(b=bias, cmask=masks["cmask"], at=at) if bias else ""
        epilogue = add + _STORE.format(o=o, where=where.format(n=n), omask=masks["omask"],
                                       value=f"acc.to({o}.dtype.element_ty)")
    else:
        epilogue = _STORE.format(o=o, where=f"ps * {m * n} + " + where.format(n=n),
                                 omask=masks["omask"], value="acc")
    body = (_ROWS if rows_form else _SWAP).format(
        x=x, w=w, k=k, swk=strides[0], swn=strides[1],
        wcast=f".to({x}.dtype.element_ty)" if widen else "", **masks)
    shape = f"[{ROWS}, {t.block_n}]" if rows_form else f"[{t.block_n}, {ROWS}]"
    return _PRODUCT.format(name=name, x=x, w=w, o=o, mp=ROWS, bn=t.block_n, bk=t.block_k,
                           chunk=t.chunk, acc_shape=shape, tiles=body, epilogue=epilogue,
                           bias_param=f", {bias}" if bias and t.splits == 1 else "")


def skinny_mm_kernel(x, w, bias, out, tiles: Tiles) -> HandKernel:
    """The kernel of x [M, K] @ w [K, N] for Buffers x (dense), w (strided) and `out`: with
    one split, out [M, N] (+ bias [N], a dense Buffer or None); else the float32 partial sums
    [splits, M, N], which the product's readers add up (codegen/lowering/matvec.py)."""
    m, k = (int(d) for d in x.shape)
    n = int(w.shape[1])
    strides = tuple(int(s) for s in w.stride)
    columns = math.ceil(n / tiles.block_n)
    bias = bias if tiles.splits == 1 else None     # a split's bias is its readers' to add
    ins = (x, w, *((bias,) if bias is not None else ()))

    def make(name, ins, outs):
        text = product_source(name, x.name, w.name, bias.name if bias is not None else None,
                              out.name, m=m, k=k, n=n, strides=strides, tiles=tiles,
                              widen=w.dtype != x.dtype)
        return hand_source(name, text, ins, outs, (columns, tiles.splits, 1),
                           tiles.num_warps, tiles.num_stages)
    kernel = HandKernel(name="kernel_mm", prefix=(), ins=ins, outs=(out,), make=make)
    kernel.reasons.append(f"product of {m} rows, {tiles.form} form ({columns} blocks of "
                          f"{tiles.block_n} columns, K in {tiles.splits} splits of "
                          f"{tiles.chunk})")
    return kernel
