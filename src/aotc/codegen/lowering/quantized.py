"""Products over quantized weights: `mm` / `addmm` of x by a quantized linear layer's weight,
lowered to aotc's hand-written kernels that read the stored int8 or packed int4 bytes: on GPUs
1 to 8 rows (decode) over int4 and fp8 by codegen/triton/quant_mv.py (int8 by the generic fused
products, quant_product says why), on CPUs float32 products of any number of
rows by codegen/cpp/quant_mm.py (rows streamed against each weight row, or for prefill panels
of weight rows dequantized once into a scratch slot).

A quantized layer (exporter/quantize.py) reaches a product as its weight dequantized in ATen
ops: for int8 `q.to(dtype)` (then scaled after the product), for int4 the nibbles unpacked
(masks, a scaling by 1/16), interleaved, shifted by 8, scaled per group and converted to the
model's dtype. Which weight a lazy value is, is decided by what it computes, not by names:

* int8: `int8_source` (codegen/lowering/matvec.py), one load of an int8 weight, converted;
* int4: its body reads exactly two weight slots, a uint8 [N, K/2] and a float32 [N, K/G]
  (G a group size of artifact/quant.py), and, evaluated on random bytes and scales in their
  place at every K of three rows, gives bit for bit what `dequantize_int4` gives in its dtype.
  The kernel then computes that weight's product from the same bytes (its rounding differs
  only in where the float32 sums round: one multiply per group instead of per weight).

Anything else (a body the evaluator cannot follow, other slots, other values) is left to the
generic lowerings, which compute the same product from the dequantized lazy value.
"""
from __future__ import annotations

import dataclasses
import operator

import sympy
import torch

from aotc.artifact.quant import GROUP_SIZES, dequantize_int4
from aotc.artifact.schema.types import SlotKind, StepKind
from aotc.codegen.ir import FloorDiv, ModIndex, NullHandler, Op, sym

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
SAMPLE_ROWS = 3
CPU_MAX_ROWS = 1 << 20     # rows of x the CPU's kernel takes (codegen/cpp/quant_mm.py)


class _NoMatch(Exception):
    """The body does something the evaluator does not follow: not a quantized weight."""


_OPS = {Op.ADD: operator.add, Op.SUB: operator.sub, Op.MUL: operator.mul,
        Op.TRUEDIV: operator.truediv, Op.BITWISE_AND: operator.and_,
        Op.BITWISE_OR: operator.or_, Op.BITWISE_XOR: operator.xor,
        Op.LSHIFT: operator.lshift, Op.RSHIFT: operator.rshift, Op.EQ: operator.eq,
        Op.NE: operator.ne, Op.LT: operator.lt, Op.LE: operator.le, Op.GT: operator.gt,
        Op.GE: operator.ge, Op.LOGICAL_AND: torch.logical_and, Op.LOGICAL_OR: torch.logical_or,
        Op.LOGICAL_NOT: torch.logical_not, Op.NEG: operator.neg,
        Op.WHERE: torch.where}


class Evaluate(NullHandler):
    """An ops handler computing a body's values with torch at a vector of index points:
    `env` maps the index symbols to int64 tensors, `tensors` slot names to stand-in tensors."""

    def __init__(self, env: dict, tensors: dict):
        self.env, self.tensors = env, tensors

    def index(self, e):
        e = sympy.sympify(e)
        if e.is_Integer:
            return torch.tensor(int(e))
        if e.is_Symbol and e in self.env:
            return self.env[e]
        args = [self.index(a) for a in e.args]
        if isinstance(e, sympy.Add):
            return sum(args[1:], args[0])
        if isinstance(e, sympy.Mul):
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if isinstance(e, FloorDiv):
            return torch.div(args[0], args[1], rounding_mode="floor")
        if isinstance(e, ModIndex):
            return torch.remainder(args[0], args[1])
        raise _NoMatch(f"index {e}")

    def load(self, name, index):
        if name not in self.tensors:
            raise _NoMatch(f"a load of {name}")
        t = self.tensors[name].reshape(-1)
        return t[self.index(index).clamp(0, t.numel() - 1)]   # masked lanes may point outside

    def constant(self, value, dtype):
        return torch.tensor(value, dtype=dtype)

    def index_expr(self, expr, dtype):
        return self.index(expr).to(dtype)

    def to_dtype(self, x, dtype):
        return x.to(dtype)

    def op(self, op, *args):
        if op not in _OPS:
            raise _NoMatch(f"op {op}")
        return _OPS[op](*args)

    def masked(self, mask, fn, other, dtype):
        value = fn()
        if not isinstance(other, torch.Tensor):
            other = torch.full((), other, dtype=value.dtype)
        return torch.where(mask, value, other)

    def indirect(self, value, size, wraps=True, op="aten::index.Tensor"):
        raise _NoMatch("an indirect index")

    def bounded_index(self, expr, size):
        return expr


class _Loads(NullHandler):
    def __init__(self):
        self.names = set()

    def load(self, name, index):
        self.names.add(name)
        return 0


@dataclasses.dataclass(frozen=True)
class QuantWeight:
    scheme: str
    values: object           # Buffer: int8 [N, K] or packed uint8 [N, K/2], row-major
    scales: object = None    # Buffer: int4's float32 [N, K/G]; None for int8
    group: int | None = None


def _weight_slots(g, names) -> dict | None:
    """{name: Buffer} of the weight slots `names` (None if any is not a weight)."""
    out = {}
    for name in names:
        sid = int(name[3:]) if name.startswith("buf") and name[3:].isdigit() else None
        if sid is None or g.plan.slot(sid).kind is not SlotKind.WEIGHT:
            return None
        out[name] = g.buffer(sid)
    return out


def _row_major(buf) -> bool:
    return len(buf.shape) == 2 and [int(s) for s in buf.stride] == [int(buf.shape[1]), 1]


def int4_source(g, w) -> QuantWeight | None:
    """The int4 layer `w` [K, N] is (see the module docstring), or None."""
    k, n = (int(d) for d in w.shape)
    probe = _Loads()
    try:
        w.loader(probe, (sym("k_probe"), sym("n_probe")))
    except (TypeError, ValueError, AttributeError, KeyError, IndexError):
        return None
    slots = _weight_slots(g, probe.names) if len(probe.names) == 2 else None
    if slots is None:
        return None
    by_dtype = {b.dtype: (name, b) for name, b in slots.items()}
    values, scales = by_dtype.get(torch.uint8), by_dtype.get(torch.float32)
    if values is None or scales is None or not all(map(_row_major, (values[1], scales[1]))):
        return None
    groups = int(scales[1].shape[1])
    group = k // groups if groups and k % groups == 0 else None
    if group not in GROUP_SIZES or [int(d) for d in values[1].shape] != [n, k // 2] or \
            int(scales[1].shape[0]) != n:
        return None
    if not _same_values(w, values, scales, k, n):
        return None
    return QuantWeight("int4", values[1], scales[1], group)


def _same_values(w, values, scales, k, n) -> bool:
    """w's body, on random bytes and scales, equals dequantize_int4 of them at SAMPLE_ROWS
    rows (first, middle, last) and every K."""
    gen = torch.Generator().manual_seed(0)
    p = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    s = torch.randn(tuple(int(d) for d in scales[1].shape), generator=gen)
    rows = torch.tensor(sorted({0, n // 2, n - 1}))[:SAMPLE_ROWS]
    ks, ns = torch.arange(k).repeat(len(rows)), rows.repeat_interleave(k)
    kv, nv = sym("k_eval"), sym("n_eval")
    h = Evaluate({kv: ks, nv: ns}, {values[0]: p, scales[0]: s})
    try:
        got = h.to_dtype(w.loader(h, (kv, nv)), w.dtype)
    except (_NoMatch, TypeError, ValueError, RuntimeError, AttributeError, KeyError,
            IndexError):
        return False
    want = dequantize_int4(p[rows], s[rows]).to(w.dtype).reshape(-1)
    return got.shape == want.shape and torch.equal(got, want)


def quant_weight(g, w) -> QuantWeight | None:
    """The quantized layer whose weight `w` [K, N] is, int8 or int4, or None."""
    from aotc.codegen.lowering.matvec import int8_source
    q8 = int8_source(g, w)
    if q8 is not None:
        k, n = (int(d) for d in w.shape)
        base = g.buffer(q8.slot)
        if _row_major(base) and [int(d) for d in base.shape] == [n, k] and \
                [int(d) for d in q8.stride] == [1, k]:          # w[k, n] is q[n, k]
            return QuantWeight("int8" if base.dtype == torch.int8 else "fp8", base)
        return None
    return int4_source(g, w)


# On GPUs an int8 product of 1 to 8 rows is left to the generic one-row and few-rows
# products (codegen/lowering/matvec.py), which read the int8 weight through `int8_source` and
# convert it in registers too, but fuse what the quantized-weight kernel cannot: the norm
# before the product and the per-channel scale after it (llama-small: 30 kernels a decode step
# against 55; bf16 26). Measured on an H100 (benchmarks/quant.py, llama-1b, bf16, batch 1):
# through them int8 decoded 1590 tokens/s against bf16's 1362 (a0d4c17); through the
# quantized-weight kernel 454 against 1300 (5925895). int4 and fp8 keep the kernel, and so
# does int8 where those products do not apply (2 to 8 rows in float32: a cuBLAS product of a
# float copy of the weight).
def _fused_int8(g, x, w, dtype) -> bool:
    """The generic one-row or few-rows products take this int8 product (see above)."""
    from aotc.codegen.lowering.matvec import _few_rows, _one_row
    return _one_row(g, x, w, dtype) or _few_rows(g, x, w, dtype)


def quant_product(g, x, w, bias, dtype):
    """x [M, K] @ w [K, N] (+ bias [N]) by the quantized-weight kernel, for 1 to 8 rows on
    GPUs over int4 and fp8 weights; None where it does not apply (the caller lowers the
    product as before)."""
    from aotc.codegen.lowering.decode import dense
    from aotc.codegen.lowering.matvec import split_sums, _static_2d
    from aotc.codegen.triton.quant_mv import MAX_ROWS, plan_quant_tiles, quant_mv_kernel
    if not g.split_reductions:
        return cpu_quant_product(g, x, w, bias, dtype)
    if not g.codegen or dtype not in FLOATS or \
            x.dtype != dtype or not _static_2d(x, w) or not 1 <= int(x.shape[0]) <= MAX_ROWS:
        return None
    if bias is not None and (len(bias.shape) != 1 or bias.dtype != dtype):
        return None
    q = quant_weight(g, w)
    if q is None or q.scheme == "int8" and _fused_int8(g, x, w, dtype):   # (see above)
        return None
    m, k, n = int(x.shape[0]), int(x.shape[1]), int(w.shape[1])
    tiles = plan_quant_tiles(m, k, n, q.scheme, q.group)
    one = tiles.splits == 1
    bb = dense(g, bias) if bias is not None and one else None
    shape = (sym(m), sym(n)) if one else (sym(tiles.splits), sym(m), sym(n))
    out = g.buffer(g.new_slot(shape, dtype if one else torch.float32))
    g.plan.update(out.slot, producer=StepKind.KERNEL)
    g.out.steps.append(quant_mv_kernel(dense(g, x), q.values, q.scales, bb, out, q.scheme,
                                       q.group, tiles))
    if one:
        return g.realized(out.slot)
    return split_sums(g, out, None if bias is None else bias.loader, tiles.splits, m, n, dtype)


def cpu_quant_product(g, x, w, bias, dtype):
    """x [M, K] @ w [K, N] (+ bias [N]) on CPUs by the C++ kernel of codegen/cpp/quant_mm.py,
    for float32 products over an int8 or int4 weight of up to CPU_MAX_ROWS rows, or of M rows
    a size symbol gives (a prefill's prompt length: the kernel picks its path when it runs);
    None where it does not apply."""
    from aotc.codegen.cpp.quant_mm import quant_mm_kernel, rows_of, scratch_shapes
    from aotc.codegen.lowering.decode import dense
    if not g.codegen or dtype != torch.float32 or x.dtype != dtype or not _rows_by_static(x, w):
        return None
    m = rows_of(x)
    if isinstance(m, int) and not 1 <= m <= CPU_MAX_ROWS:
        return None
    if bias is not None and (len(bias.shape) != 1 or bias.dtype != dtype):
        return None
    q = quant_weight(g, w)
    if q is None or q.scheme not in ("int8", "int4"):
        return None
    k, n = int(x.shape[1]), int(w.shape[1])
    out = g.buffer(g.new_slot((sym(m), sym(n)), dtype))
    scratch = [g.buffer(g.new_slot(tuple(sym(d) for d in shape), dtype))
               for shape in scratch_shapes(m, k, q.scheme, q.group)]
    for b in (out, *scratch):
        g.plan.update(b.slot, producer=StepKind.KERNEL)
    bb = dense(g, bias) if bias is not None else None
    g.out.steps.append(quant_mm_kernel(dense(g, x), q.values, q.scales, bb, out, scratch,
                                       q.scheme, q.group))
    return g.realized(out.slot)


def _rows_by_static(x, w) -> bool:
    """x [M, K] and w [K, N] with K and N static; M static or a positive size expression."""
    if len(x.shape) != 2 or len(w.shape) != 2:
        return False
    static = all(getattr(d, "is_Integer", isinstance(d, int)) for d in (x.shape[1], *w.shape))
    m = sympy.sympify(x.shape[0])
    return static and (m.is_Integer or bool(m.is_positive))
