"""Products of a few rows on GPUs: `mm` / `addmm` of x [M, K] (2 <= M <= 16) by a weight
[K, N], written by hand as a Triton kernel that streams the weight once.

A decode step at batch 8 multiplies 8 rows by every weight. Like a product of one row
(codegen/lowering/matvec.py) it is bound by reading the weight, but cuBLAS's kernels for it
reach only about half the device's copy rate (a LLaMA-1B step at batch 8 spent 820 of its
1120 us of kernels in them). Here each program owns a block of BLOCK_N output columns: it
loops over its share of K, loading x's rows ([16, BLOCK_K], padded with zeros: tensor-core
products need 16 rows) and the weight's [BLOCK_K, BLOCK_N] tile, and accumulates their
`tl.dot` in float32. Where the column blocks alone give too few programs to keep the
device's memory busy, K is split too: each split stores its float32 partial sums and a
second kernel adds them, with the bias, in a fixed order (the result does not depend on
which program finishes first, as it would with atomics).

The tiles are multiplied in tf32, widened to float32 first (decode_attention.dot_precision
says why that is exact for bf16 and fp16, and why the widening).

The weight may have any strides (an nn.Linear weight [N, K] reaches the product as its
permuted view, GPT-2's Conv1D weights are stored transposed on GPUs: codegen/gpu_layouts.py);
loads of the tile follow them. Sizes are static and the grid is fixed, so decode replays as
one CUDA graph. Only Triton builtins are called (codegen/triton/printer.py says why), so the
interpreter runs these kernels too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from aotc.codegen.triton.decode_attention import HandKernel

MAX_ROWS = 16
ROWS = 16                  # x's rows padded to a tensor-core product's
TARGET_PROGRAMS = 264      # about two programs per SM of an H100/H200


@dataclass(frozen=True)
class Tiles:
    block_n: int
    block_k: int
    splits: int            # K split over this many programs per column block
    chunk: int             # K elements per split (a multiple of block_k)
    num_warps: int = 4
    num_stages: int = 4


def plan_tiles(m: int, k: int, n: int, *, block_n: int = 32, block_k: int = 128,
               target: int = TARGET_PROGRAMS) -> Tiles:
    """Column blocks of `block_n`; K split so that the programs reach `target`, each split
    at least four K blocks long (shorter ones spend more on their partial sums than they
    gain in parallel reads)."""
    block_k = min(block_k, max(16, _pow2(k)))
    columns = math.ceil(n / block_n)
    most = max(1, k // (4 * block_k))
    splits = max(1, min(most, math.ceil(target / columns)))
    chunk = math.ceil(k / splits / block_k) * block_k
    return Tiles(block_n, block_k, math.ceil(k / chunk), chunk)


_PRODUCT = '''
@triton.jit
def {name}({x}, {w}{bias_param}, {o}):
    pn = tl.program_id(0)
    ps = tl.program_id(1)
    rows = tl.arange(0, {mp})
    cols = pn * {bn} + tl.arange(0, {bn})
    acc = tl.full([{mp}, {bn}], 0.0, tl.float32)
    for k0 in range(0, {chunk}, {bk}):
        ks = ps * {chunk} + k0 + tl.arange(0, {bk})
        xt = tl.load({x} + rows[:, None] * {k} + ks[None, :]{xmask})
        wt = tl.load({w} + ks[:, None] * {swk} + cols[None, :] * {swn}{wmask})
        acc += tl.dot(xt.to(tl.float32), wt.to(tl.float32), input_precision="tf32")
{epilogue}'''

_STORE = '''{bias}    tl.store({o} + rows[:, None] * {n} + cols[None, :], acc.to({o}.dtype.element_ty),
             mask={omask})
'''
_STORE_PART = '''    tl.store({o} + (ps * {m} + rows[:, None]) * {n} + cols[None, :], acc, mask={omask})
'''
_BIAS = "    acc += tl.load({b} + cols{cmask}).to(tl.float32)[None, :]\n"

_COMBINE = '''
@triton.jit
def {name}({p}{bias_param}, {o}):
    idx = tl.program_id(0) * {block} + tl.arange(0, {block})
    live = idx < {mn}
    acc = tl.load({p} + idx, mask=live, other=0.0)
    for s in range(1, {splits}):
        acc += tl.load({p} + s * {mn} + idx, mask=live, other=0.0)
{bias}    tl.store({o} + idx, acc.to({o}.dtype.element_ty), mask=live)
'''
COMBINE_BLOCK = 1024


def _masks(m: int, k: int, n: int, t: Tiles) -> dict:
    """The load and store masks, each left out where the sizes make it always true."""
    kfull = t.chunk * t.splits == k
    rmask = "(rows < {m})".replace("{m}", str(m))
    cmask = f"(cols < {n})" if n % t.block_n else ""
    kmask = "" if kfull else f"(ks < {k})"
    xm = " & ".join(f"{a}[{b}]" for a, b in ((rmask, ":, None"), (kmask, "None, :")) if a)
    wm = " & ".join(f"{a}[{b}]" for a, b in ((kmask, ":, None"), (cmask, "None, :")) if a)
    om = " & ".join(f"{a}[{b}]" for a, b in ((rmask, ":, None"), (cmask, "None, :")) if a)
    return {"xmask": f", mask={xm}, other=0.0" if xm else "",
            "wmask": f", mask={wm}, other=0.0" if wm else "",
            "omask": om, "cmask": f", mask={cmask}, other=0.0" if cmask else ""}


def product_source(name: str, x: str, w: str, bias: str | None, o: str, *, m: int, k: int,
                   n: int, strides: tuple, tiles: Tiles) -> str:
    """The Triton source of the product kernel: with one split it stores x @ w (+ bias) in
    o's dtype, else float32 partial sums [splits, m, n]."""
    masks = _masks(m, k, n, tiles)
    if tiles.splits == 1:
        add = _BIAS.format(b=bias, cmask=masks["cmask"]) if bias else ""
        epilogue = _STORE.format(bias=add, o=o, n=n, omask=masks["omask"])
    else:
        epilogue = _STORE_PART.format(o=o, m=m, n=n, omask=masks["omask"])
    return _PRODUCT.format(name=name, x=x, w=w, o=o, mp=ROWS, bn=tiles.block_n,
                           bk=tiles.block_k, chunk=tiles.chunk, k=k, swk=strides[0],
                           swn=strides[1], epilogue=epilogue,
                           bias_param=f", {bias}" if bias and tiles.splits == 1 else "",
                           **{key: masks[key] for key in ("xmask", "wmask")})


def combine_source(name: str, p: str, bias: str | None, o: str, *, m: int, n: int,
                   splits: int) -> str:
    add = f"    acc += tl.load({bias} + idx % {n}, mask=live, other=0.0).to(tl.float32)\n" \
        if bias else ""
    return _COMBINE.format(name=name, p=p, o=o, block=COMBINE_BLOCK, mn=m * n, splits=splits,
                           bias=add, bias_param=f", {bias}" if bias else "")


def _kernel_source(name: str, text: str, ins, outs, grid, tiles: Tiles, warps: int):
    from aotc.codegen.triton.build import KernelSource
    from aotc.codegen.triton.printer import POINTER
    signature = {b.name: POINTER[b.dtype] for b in (*ins, *outs)}
    return KernelSource(name=name, text=text.lstrip("\n"), ins=[b.name for b in ins],
                        outs=[b.name for b in outs], sizes=[], signature=signature,
                        constexprs={}, grid=[str(g) for g in grid], num_warps=warps,
                        error_code=None, num_stages=tiles.num_stages)


def skinny_mm_kernels(x, w, bias, out, partial, tiles: Tiles) -> list[HandKernel]:
    """The kernels of out [M, N] = x [M, K] @ w [K, N] (+ bias [N]) for Buffers x (dense),
    w (strided), bias (dense or None) and out (dense); `partial` is the float32 Buffer
    [splits, M, N] of the split sums (None with one split)."""
    m, k = (int(d) for d in x.shape)
    n = int(w.shape[1])
    strides = tuple(int(s) for s in w.stride)
    columns = math.ceil(n / tiles.block_n)
    one = tiles.splits == 1
    prod_ins = (x, w, *((bias,) if bias is not None and one else ()))
    prod_out = out if one else partial

    def make_product(name, ins, outs):
        text = product_source(name, x.name, w.name, bias.name if bias is not None and one
                              else None, outs[0].name, m=m, k=k, n=n, strides=strides,
                              tiles=tiles)
        return _kernel_source(name, text, ins, outs, (columns, tiles.splits, 1), tiles,
                              tiles.num_warps)
    kernels = [HandKernel(name="kernel_mm", prefix=(), ins=prod_ins, outs=(prod_out,),
                          make=make_product)]
    kernels[0].reasons.append(f"product of {m} rows ({columns} blocks of {tiles.block_n} "
                              f"columns, K in {tiles.splits} splits of {tiles.chunk})")
    if not one:
        def make_combine(name, ins, outs):
            text = combine_source(name, partial.name, bias.name if bias is not None else None,
                                  out.name, m=m, n=n, splits=tiles.splits)
            return _kernel_source(name, text, ins, outs,
                                  (math.ceil(m * n / COMBINE_BLOCK), 1, 1), tiles, 4)
        combine = HandKernel(name="kernel_mm_sum", prefix=(),
                             ins=(partial, *((bias,) if bias is not None else ())),
                             outs=(out,), make=make_combine)
        combine.reasons.append(f"sums the product's {tiles.splits} K splits")
        kernels.append(combine)
    return kernels


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
