"""Products of one row on GPUs: `mm` / `addmm` with a single row of x (a decode step at batch 1,
each projection a matrix-vector product) lowered to a reduction over K instead of a cuBLAS call.

At one row a product reads each weight once and does two flops per weight: it is a streaming
reduction, bound by memory. cuBLAS's kernels for it reach about half the device's copy rate on
an H200 (a LLaMA-1B decode step spent 814 of its 1190 us in them); as loop IR it becomes a
Triton reduction over contiguous rows of the weight, as fast as aotc's row sums, and fuses with
what it feeds and reads: the bias add, SiLU of the gate times the up projection (two products
over the same rows, fused horizontally into one kernel that reads x once), residual adds.
Products of 2 to 16 rows (decode at a small batch) run the hand-written kernel of
codegen/triton/skinny_mm.py, which streams the weight once too; its split sums are added by
the kernels that read the product. Products of more rows, fp32 products of more than one row,
and every other product on CPUs stay vendor GEMMs.

Quantized layers (--quantize int8, exporter/quantize.py) reach a product as their int8 weight
converted to the compute dtype and transposed; `int8_source` recognizes that weight, so these
kernels read the int8 bytes and convert them in registers: the one-row reduction on GPUs and,
for bf16 and fp16 models, on CPUs (a C++ reduction over int8 rows, where a vendor GEMM would
need a float copy of the weight first), and the few-rows kernel. Products over an int8, int4
or fp8 layer go first to aotc's quantized-weight kernels (codegen/lowering/quantized.py: on
GPUs 1 to 8 rows, on CPUs every float32 product), which `mm` and `addmm` ask before anything
here.
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from aotc.codegen.ir import NullHandler, Op, ReductionType as R, sym
from aotc.codegen.lowering import out_dtype, out_shape, register
from aotc.codegen.lowering.quantized import quant_product
from aotc.artifact.schema.types import SlotKind, StepKind
from aotc.codegen.lowering.reductions import acc_dtype
from aotc.codegen.lowering.row_statistics import statistics_prologue

aten = torch.ops.aten
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
HALVES = (torch.float16, torch.bfloat16)   # tensor-core products (fp32 would round to tf32)
WIDENED = (torch.int8, torch.float8_e4m3fn)   # stored values a quantized layer converts
INLINE_VECTOR_OPS = 2      # a vector operand costing more ops than this is stored once


def _static_2d(x, w) -> bool:
    """x and w are matrices of static sizes."""
    return len(x.shape) == 2 and len(w.shape) == 2 and \
        all(getattr(d, "is_Integer", isinstance(d, int)) for d in (*x.shape, *w.shape))


def _one_row(g, x, w, dtype) -> bool:
    """A product of one row, lowered as a reduction: on GPUs always; on CPUs only over a
    quantized layer's int8 weight that the quantized-weight kernel left (a bf16 or fp16
    product), which the C++ reduction reads directly (a vendor GEMM would need a float copy
    of the weight first)."""
    if not g.codegen or dtype not in FLOATS or not _static_2d(x, w) or int(x.shape[0]) != 1:
        return False
    return g.split_reductions or int8_source(g, w) is not None


def _few_rows(g, x, w, dtype) -> bool:
    from aotc.codegen.triton.skinny_mm import MAX_ROWS
    if not g.split_reductions or not g.codegen or dtype not in HALVES or \
            x.dtype != dtype or w.dtype != dtype:
        return False
    return _static_2d(x, w) and 2 <= int(x.shape[0]) <= MAX_ROWS


class _Probe(NullHandler):
    """Records what a body does: its loads (name, index) and every other op."""

    def __init__(self):
        self.loads, self.ops = [], []

    def load(self, name, index):
        self.loads.append((name, index))
        return "loaded"

    def to_dtype(self, x, dtype):
        self.ops.append(("to_dtype", x, dtype))
        return "converted"

    def op(self, op, *args):
        self.ops.append(op)
        return 0


def int8_source(g, w):
    """The int8 (or fp8) weight slot that `w` [K, N] converts element for element (a quantized
    linear layer's weight, `q.to(dtype)` seen through its transpose: exporter/quantize.py), as
    a Buffer with w's shape and the strides that read it; None for any other w. The few-rows
    kernel then streams the int8 bytes and converts them in registers instead of a float copy."""
    if w.buffer is not None or len(w.shape) != 2:
        return None
    probe, k, n = _Probe(), sym("k_probe"), sym("n_probe")
    try:
        w.loader(probe, (k, n))
    except (TypeError, ValueError, AttributeError, KeyError, IndexError):
        return None    # a body the probe cannot follow is no plain widening of a weight
    if len(probe.loads) != 1 or len(probe.ops) != 1 or probe.ops[0][0] != "to_dtype" or \
            probe.ops[0][1] != "loaded":
        return None
    name, index = probe.loads[0][0], sympy.sympify(probe.loads[0][1])
    sid = int(name[3:]) if name.startswith("buf") and name[3:].isdigit() else None
    if sid is None or g.plan.slot(sid).kind is not SlotKind.WEIGHT:
        return None
    buf = g.buffer(sid)
    if buf.dtype not in WIDENED or len(buf.shape) != 2:
        return None
    stride = (index.coeff(k), index.coeff(n))
    if sympy.expand(index - stride[0] * k - stride[1] * n) != 0 or \
            sorted(stride, key=str) != sorted(buf.stride, key=str):
        return None
    return dataclasses.replace(buf, shape=tuple(w.shape), stride=stride)


def _skinny(g, x, w, bias, dtype):
    """x [M, K] @ w [K, N] (+ bias [N]) by the few-rows kernel. With one split it writes the
    product into a new dense slot; else its float32 partial sums, and the product is a lazy
    value adding them (and the bias) in order, which its readers compute as they load it."""
    from aotc.codegen.lowering.decode import dense
    from aotc.codegen.triton.skinny_mm import plan_tiles, skinny_mm_kernel
    m, k, n = int(x.shape[0]), int(x.shape[1]), int(w.shape[1])
    xb = dense(g, x)
    wb = int8_source(g, w) or g.buffer(g.materialize(w))
    tiles = plan_tiles(k, n)
    one = tiles.splits == 1
    bb = dense(g, bias) if bias is not None and one else None
    shape = (sym(m), sym(n)) if one else (sym(tiles.splits), sym(m), sym(n))
    out = g.buffer(g.new_slot(shape, dtype if one else torch.float32))
    g.plan.update(out.slot, producer=StepKind.KERNEL)
    g.out.steps.append(skinny_mm_kernel(xb, wb, bb, out, tiles))
    if one:
        return g.realized(out.slot)
    return split_sums(g, out, bias.loader if bias is not None else None, tiles.splits, m, n,
                      dtype)


def split_sums(g, out, lb, splits: int, m: int, n: int, dtype):
    """The product whose float32 partial sums [splits, m, n] a kernel stored in `out`: a lazy
    value adding them (and the bias, loader `lb`) in order, which its readers compute as they
    load it (the few-rows and the quantized-weight kernels)."""
    lp = out.loader()

    def fn(h, i):
        acc = lp(h, (0, *i))
        for s in range(1, splits):
            acc = h.op(Op.ADD, acc, lp(h, (s, *i)))
        if lb is not None:
            acc = h.op(Op.ADD, acc, h.to_dtype(lb(h, (i[-1],)), torch.float32))
        return h.to_dtype(acc, dtype)
    return g.pointwise((sym(m), sym(n)), dtype, fn, "addmm" if lb is not None else "mm")


def _vector(g, x):
    """The loader of x's values. Every program of the product reads all of x, so a value
    computed inline (RMSNorm's output, SiLU of the gate times the up projection) would be
    computed again by each of them: hundreds of times over for one row of a few thousand
    elements, which measured as slow as the weights' stream itself (a LLaMA-1B down
    projection: 15.5 us with SiLU(gate) * up inline, 7.7 us from a stored vector). Such an x
    is realized: stored once, by its producer's kernel where it fuses there, then loaded."""
    from aotc.codegen.graph import body_cost   # (graph imports the lowerings)
    if x.buffer is None and (x.body is not None or x.view_of is not None):
        cost = body_cost(x.shape, x.loader)
        if cost.expensive or cost.ops > INLINE_VECTOR_OPS:
            g.realize(x)
            return x.buffer.loader()
    return x.loader


def _matvec(g, x, w, dtype):
    """x [1, K] @ w [K, N] as a reduction (accumulated in float32) over K. An x normalized
    by row statistics (RMSNorm, LayerNorm) is computed by the product's own programs
    (codegen/lowering/row_statistics.py); any other computed x is stored once (`_vector`)."""
    rows = (x.shape[0], w.shape[1])
    lx = statistics_prologue(g, x, rows)
    if lx is None:
        lv = _vector(g, x)
        lx = lambda h, i, row: lv(h, i)   # noqa: E731
    lw, acc, k = w.loader, acc_dtype(dtype), w.shape[0]

    def body(h, idx, ridx):   # the weight first: its loads may start before the predecessor ends
        wv = h.to_dtype(lw(h, (ridx[0], idx[1])), acc)   # (codegen/triton/build.py pdl_body)
        return h.op(Op.MUL, h.to_dtype(lx(h, (idx[0], ridx[0]), idx), acc), wv)
    red, = g.reduction(rows, (k,), R.SUM, acc, body, "matvec")
    return red


ALIGN_BYTES = 16   # cuBLAS's tensor-core kernels want every leading dimension this aligned


def _misaligned_rows(g, x, w, dtype) -> bool:
    """A vendor product on a GPU whose output rows would start at addresses that are not
    ALIGN_BYTES-aligned (N * itemsize: GPT-2's LM head over its 50257-token vocabulary, in
    bf16), while its transpose's rows would be (M * itemsize)."""
    if not g.split_reductions or not g.codegen or dtype not in HALVES or \
            not _static_2d(x, w) or x.dtype != dtype or w.dtype != dtype:
        return False
    m, n, item = int(x.shape[0]), int(w.shape[1]), torch.empty((), dtype=dtype).element_size()
    return (n * item) % ALIGN_BYTES != 0 and (m * item) % ALIGN_BYTES == 0


def _transposed_product(g, x, w, dtype):
    """x [M, K] @ w [K, N] computed as (w^T @ x^T)^T: with N * itemsize not 16-byte aligned,
    the [M, N] output's leading dimension rules out cuBLAS's tensor-core kernels (its
    heuristics fall back to slow ones: GPT-2's tied LM head at 16 x 128 tokens made aotc 0.53x
    of reduce-overhead, whose Inductor pads the product instead). The [N, M] product's rows
    are aligned and its operands are views (w^T is nn.Linear's own [N, K] weight, x^T a view
    of x): no copy. The result is its transposed view, strides [1, M], as a channels-last
    convolution's output keeps its own strides; kernels reading it index it as it is."""
    wt = _transposed_view(g, g.materialize(w))
    xt = _transposed_view(g, g.materialize(x))
    out = g.extern_call("aten::mm.default", [wt, xt], (w.shape[1], x.shape[0]), dtype)
    load = out.loader
    return g.pointwise((x.shape[0], w.shape[1]), dtype, lambda h, i: load(h, (i[1], i[0])),
                       "mm")


def _transposed_view(g, sid: int):
    """A view step transposing the 2-d tensor in slot `sid`; the view, realized."""
    buf = g.buffer(sid)
    out = g.new_slot(buf.shape[::-1], buf.dtype, stride=buf.stride[::-1])
    g.plan.update(out, producer=StepKind.VIEW)
    g.out.steps.append(g.plan.call("aten::permute.default", [{"slot": sid}, [1, 0]], {}, [out],
                                   view=True))
    return g.realized(out)


@register(aten.mm.default)
def mm(g, metas, x, w):
    dtype = out_dtype(metas)
    quantized = quant_product(g, x, w, None, dtype)
    if quantized is not None:
        return quantized
    if not _one_row(g, x, w, dtype):
        if _few_rows(g, x, w, dtype):
            return _skinny(g, x, w, None, dtype)
        return _transposed_product(g, x, w, dtype) if _misaligned_rows(g, x, w, dtype) \
            else None
    red = _matvec(g, x, w, dtype)
    load = red.loader
    return g.pointwise(out_shape(metas), dtype, lambda h, i: h.to_dtype(load(h, i), dtype),
                       "mm")


def addmm_few_rows(g, metas, bias, x, w):
    """bias + x @ w for one row of x, or for 2 to 16 with a bias [N] (addmm's lowering asks
    this first), else None."""
    dtype = out_dtype(metas)
    quantized = quant_product(g, x, w, bias, dtype) if len(bias.shape) == 1 else None
    if quantized is not None:
        return quantized
    if len(bias.shape) == 1 and bias.dtype == dtype and _few_rows(g, x, w, dtype):
        return _skinny(g, x, w, bias, dtype)
    if not _one_row(g, x, w, dtype) or len(bias.shape) not in (1, 2):
        return None
    red = _matvec(g, x, w, dtype)
    lr, lb, acc = red.loader, bias.loader, acc_dtype(dtype)
    one = len(bias.shape) == 1

    def fn(h, i):
        b = lb(h, (i[-1],) if one else i)
        return h.to_dtype(h.op(Op.ADD, lr(h, i), h.to_dtype(b, acc)), dtype)
    return g.pointwise(out_shape(metas), dtype, fn, "addmm")
