"""Movement and indexing lowerings: cat, constant_pad_nd, flip, roll, embedding, index_select,
gather, index.Tensor; pooling (max/avg/adaptive avg 2d). These copy data, so they are pointwise
or reduction bodies with remapped, masked or indirect loads.
"""
from __future__ import annotations

import torch

from aotc.codegen.constfold import constant_value
from aotc.codegen.ir import Op, ReductionType as R, product, sym
from aotc.codegen.lowering import is_tensor, out_dtype, out_shape, register
from aotc.codegen.lowering.reductions import acc_dtype

aten = torch.ops.aten


@register(aten.cat.default)
def cat(g, metas, tensors, dim=0):
    shape, dtype = out_shape(metas), out_dtype(metas)
    dim = dim % len(shape)
    parts, start = [], 0
    for t in tensors:
        if len(t.shape) == 1 and t.shape[0] == 0:
            continue   # legacy empty tensors are skipped by cat
        parts.append((start, t))
        start = start + t.shape[dim]
    if not parts:   # only legacy empty inputs: the result is empty too
        return g.pointwise(shape, dtype, lambda h, idx: h.constant(0, dtype), "cat")

    def fn(h, idx):
        def load(k):   # called inside the mask that keeps idx[dim] in part k's range
            off, t = parts[k]
            i = tuple(h.bounded_index(v - off, t.shape[dim]) if d == dim and len(parts) > 1
                      else v for d, v in enumerate(idx))
            return h.to_dtype(t.loader(h, i), dtype)
        # every part, the last one too, is read only in its own range: no load outside a buffer
        i = h.index_expr(idx[dim], torch.int64)
        last = len(parts) - 1
        value = load(last) if last == 0 else h.masked(
            h.op(Op.GE, i, h.index_expr(parts[last][0], torch.int64)), lambda: load(last), 0, dtype)
        for k in range(len(parts) - 2, -1, -1):
            end = parts[k + 1][0]
            cond = h.op(Op.LT, h.index_expr(idx[dim], torch.int64), h.index_expr(end, torch.int64))
            value = h.masked(cond, (lambda k: lambda: load(k))(k), value, dtype)
        return value
    return g.pointwise(shape, dtype, fn, "cat")


@register(aten.constant_pad_nd.default)
def constant_pad(g, metas, x, pad, value=0):
    shape, dtype = out_shape(metas), out_dtype(metas)
    n = len(shape)
    lows = {n - 1 - k // 2: pad[k] for k in range(0, len(pad), 2)}

    def fn(h, idx):
        src = tuple(v - lows.get(d, 0) for d, v in enumerate(idx))
        conds = []
        for d, lo in lows.items():
            i = h.index_expr(src[d], torch.int64)
            conds += [h.op(Op.GE, i, h.constant(0, torch.int64)),
                      h.op(Op.LT, i, h.index_expr(x.shape[d], torch.int64))]
        if not conds:
            return x.loader(h, src)
        mask = conds[0]
        for c in conds[1:]:
            mask = h.op(Op.LOGICAL_AND, mask, c)
        return h.masked(mask, lambda: h.to_dtype(x.loader(h, src), dtype), value, dtype)
    return g.pointwise(shape, dtype, fn, "pad")


@register(aten.flip.default)
def flip(g, metas, x, dims):
    dims = {d % len(x.shape) for d in dims}
    load = x.loader
    return g.pointwise(x.shape, x.dtype, lambda h, idx: load(h, tuple(
        (x.shape[d] - 1 - v) if d in dims else v for d, v in enumerate(idx))), "flip")


@register(aten.roll.default)
def roll(g, metas, x, shifts, dims=()):
    if not dims or len(shifts) != len(dims):
        return None
    from aotc.codegen.ir import ModIndex
    amount = {d % len(x.shape): s for d, s in zip(dims, shifts)}
    load = x.loader
    return g.pointwise(x.shape, x.dtype, lambda h, idx: load(h, tuple(
        ModIndex(v + (x.shape[d] - amount[d] % x.shape[d]), x.shape[d]) if d in amount else v
        for d, v in enumerate(idx))), "roll")


@register(aten.embedding.default)
def embedding(g, metas, weight, indices, padding_idx=-1, scale_grad=False, sparse=False):
    shape, dtype = out_shape(metas), out_dtype(metas)
    nidx = len(indices.shape)
    lw, li = weight.loader, indices.loader

    def fn(h, idx):
        row = h.indirect(li(h, tuple(idx[:nidx])), weight.shape[0], wraps=False,
                         op="aten::embedding.default")
        return lw(h, (row, idx[nidx]))
    return g.pointwise(shape, dtype, fn, "embedding")


SELECT, GATHER = "aten::index_select.default", "aten::gather.default"


@register(aten.index_select.default)
def index_select(g, metas, x, dim, index):
    dim = dim % max(len(x.shape), 1)
    shape = out_shape(metas)
    lx, li = x.loader, index.loader
    if not x.shape:   # 0-d source: the one index must be 0; the result is 0-d
        from aotc.codegen.ir import sym as zero_index
        first = tuple(zero_index(0) for _ in index.shape)
        return g.pointwise(shape, x.dtype, lambda h, idx: (
            h.indirect(li(h, first), 1, wraps=False, op=SELECT), lx(h, ()))[1], "index_select")

    def fn(h, idx):
        j = h.indirect(li(h, (idx[dim],)), x.shape[dim], wraps=False, op=SELECT)
        return lx(h, tuple(j if d == dim else v for d, v in enumerate(idx)))
    return g.pointwise(shape, x.dtype, fn, "index_select")


@register(aten.gather.default)
def gather(g, metas, x, dim, index, sparse_grad=False):
    dim = dim % max(len(x.shape), 1)
    lx, li = x.loader, index.loader
    if not x.shape:   # 0-d source: every index must be 0
        return g.pointwise(out_shape(metas), x.dtype, lambda h, idx: (
            h.indirect(li(h, idx), 1, wraps=False, op=GATHER), lx(h, ()))[1], "gather")

    def fn(h, idx):
        j = h.indirect(li(h, idx), x.shape[dim], wraps=False, op=GATHER)
        return lx(h, tuple(j if d == dim else v for d, v in enumerate(idx)))
    return g.pointwise(out_shape(metas), x.dtype, fn, "gather")


@register(aten.index.Tensor)
def index(g, metas, x, indices):
    """Advanced indexing with index tensors on some dims (None elsewhere)."""
    positions = [d for d, t in enumerate(indices) if t is not None]
    if not positions or any(not is_tensor(indices[d]) or indices[d].dtype == torch.bool
                            for d in positions):
        return None
    shape = out_shape(metas)
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    bshape_len = len(shape) - (len(x.shape) - len(positions))
    first = positions[0] if adjacent else 0
    from aotc.codegen.lowering import broadcast

    def fn(h, idx):
        bidx = tuple(idx[first:first + bshape_len])
        bshape = shape[first:first + bshape_len]
        rest = list(idx[:first]) + list(idx[first + bshape_len:])
        src, r = [], iter(rest)
        for d in range(len(x.shape)):
            if d in positions:
                t = indices[d]
                src.append(h.indirect(broadcast(t, bshape)(h, bidx), x.shape[d]))
            else:
                src.append(next(r))
        return x.loader(h, tuple(src))
    return g.pointwise(shape, x.dtype, fn, "index")


WINDOW_UNROLL = 25   # pooling windows up to 5x5 are unrolled (as Inductor does)


def _window_reader(x, stride, padding, dilation, ceil_mode, pad_value):
    """`read(h, idx, (a, b), dtype) -> (value, ih, iw)`: element (a, b) of output idx's pooling
    window and its row and column in the input. Windows that reach past the input (padding, or
    the extra window of ceil_mode) read it masked, as `pad_value` outside."""
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    H, W = x.shape[-2], x.shape[-1]
    lx = x.loader
    masked = bool(ph or pw or ceil_mode)

    def read(h, idx, ridx, dtype):
        ih = idx[-2] * sh - ph + ridx[0] * dh
        iw = idx[-1] * sw - pw + ridx[1] * dw
        src = tuple(idx[:-2]) + (ih, iw)
        load = lambda: h.to_dtype(lx(h, src), dtype)
        if not masked:
            return load(), ih, iw
        i, j = h.index_expr(ih, torch.int64), h.index_expr(iw, torch.int64)
        zero = h.constant(0, torch.int64)
        mask = h.op(Op.LOGICAL_AND, h.op(Op.LOGICAL_AND, h.op(Op.GE, i, zero),
                                         h.op(Op.LT, i, h.index_expr(H, torch.int64))),
                    h.op(Op.LOGICAL_AND, h.op(Op.GE, j, zero),
                         h.op(Op.LT, j, h.index_expr(W, torch.int64))))
        return h.masked(mask, load, pad_value, dtype), ih, iw
    return read


def _window(g, metas, x, kernel, stride, padding, dilation, rtype, origin, post=None,
            count=None, ceil_mode=False):
    """A 2d pooling window as a reduction over (kh, kw) for each output element."""
    shape, dtype = out_shape(metas), out_dtype(metas)
    kh, kw = kernel
    acc = acc_dtype(dtype)
    read = _window_reader(x, stride or kernel, padding, dilation, ceil_mode,
                          float("-inf") if rtype == R.MAX else 0.0)
    body = lambda h, idx, ridx: read(h, idx, ridx, acc)[0]
    if isinstance(kh, int) and isinstance(kw, int) and kh * kw <= WINDOW_UNROLL:
        # a small window: unrolled into a pointwise body, so a kernel vectorizes along the
        # output's rows (a reduction would vectorize over the window's few elements)
        combine = Op.MAXIMUM if rtype == R.MAX else Op.ADD

        def fn(h, idx):
            value = None
            for a in range(kh):
                for b in range(kw):
                    v = body(h, idx, (a, b))
                    value = v if value is None else h.op(combine, value, v)
            return h.to_dtype(post(h, value) if post else value, dtype)
        return g.pointwise(shape, dtype, fn, origin)
    red, = g.reduction(shape, (kh, kw), rtype, acc, body, origin)
    if post is None and acc == dtype:
        return red
    load = red.loader
    return g.pointwise(shape, dtype, lambda h, i: h.to_dtype(
        post(h, load(h, i)) if post else load(h, i), dtype), origin)


@register(aten.max_pool2d_with_indices.default)
def max_pool2d(g, metas, x, kernel, stride=(), padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    if len(kernel) != 2:
        return None
    padding = tuple(padding) * (2 // len(padding)) if padding else (0, 0)
    dilation = tuple(dilation) * (2 // len(dilation)) if dilation else (1, 1)
    stride = tuple(stride) * (2 // len(stride)) if stride else tuple(kernel)
    if not g.used(1):
        return _window(g, metas, x, kernel, stride, padding, dilation, R.MAX, "max_pool2d",
                       ceil_mode=ceil_mode), None
    kh, kw = kernel
    if not (isinstance(kh, int) and isinstance(kw, int) and kh * kw <= WINDOW_UNROLL):
        return None   # the indices of large windows: ATen's kernel
    values = _window(g, metas, x, kernel, stride, padding, dilation, R.MAX, "max_pool2d",
                     ceil_mode=ceil_mode)
    return values, _window_argmax(g, metas, x, kernel, stride, padding, dilation, ceil_mode)


def _window_argmax(g, metas, x, kernel, stride, padding, dilation, ceil_mode):
    """max_pool2d's indices: the flat position in the input plane of each window's maximum,
    as training saves for the backward, from an unrolled body (the values come from the
    vectorized max window). ATen's rule: a later element wins if it is greater or NaN, so ties
    keep the first; padding never wins."""
    shape, dtype = out_shape(metas), out_dtype(metas)
    kh, kw = kernel
    W = x.shape[-1]
    read = _window_reader(x, stride, padding, dilation, ceil_mode, float("-inf"))

    def scan(h, idx):
        best = pos = None
        for a in range(kh):
            for b in range(kw):
                v, ih, iw = read(h, idx, (a, b), dtype)
                # positions held as floats (exact below 2**24) keep every select in the float
                # lanes of the values, so the loop vectorizes; stored as int64 at the end
                where = h.index_expr(ih * W + iw, pos_dtype)
                if best is None:
                    best, pos = v, where
                    continue
                take = h.op(Op.LOGICAL_OR, h.op(Op.GT, v, best), h.op(Op.NE, v, v))
                best = h.op(Op.WHERE, take, v, best)
                pos = h.op(Op.WHERE, take, where, pos)
        return best, pos
    plane = x.shape[-2] * W
    pos_dtype = torch.float32 if plane.is_Integer and int(plane) < 1 << 24 else torch.int64
    return g.pointwise(shape, torch.int64, lambda h, i: h.to_dtype(scan(h, i)[1], torch.int64),
                       "max_pool2d_indices")


@register(aten.avg_pool2d.default)
def avg_pool2d(g, metas, x, kernel, stride=(), padding=(0, 0), ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    kernel = tuple(kernel) * (2 // len(kernel))
    padding = tuple(padding) * (2 // len(padding)) if padding else (0, 0)
    stride = tuple(stride) * (2 // len(stride)) if stride else kernel
    if ceil_mode or (any(padding) and not count_include_pad):
        return None
    div = divisor_override or kernel[0] * kernel[1]
    acc = acc_dtype(out_dtype(metas))
    return _window(g, metas, x, kernel, stride, padding, (1, 1), R.SUM, "avg_pool2d",
                   post=lambda h, v: h.op(Op.TRUEDIV, v, h.constant(div, acc)))


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(g, metas, x, output_size):
    H, W = x.shape[-2], x.shape[-1]
    oh, ow = output_size
    if not (H.is_Integer and W.is_Integer) or int(H) % oh or int(W) % ow:
        return None
    kh, kw = int(H) // oh, int(W) // ow
    acc = acc_dtype(out_dtype(metas))
    return _window(g, metas, x, (kh, kw), (kh, kw), (0, 0), (1, 1), R.SUM, "adaptive_avg_pool2d",
                   post=lambda h, v: h.op(Op.TRUEDIV, v, h.constant(kh * kw, acc)))


del product, sym


@register(aten.cumsum.default)
def cumsum(g, metas, x, dim, dtype=None):
    """The cumulative sum of a tensor that export proves constant, c * (position + 1), inlined;
    any other input stays ATen's scan. Traced transformers build packed-sequence ids as the
    cumsum of an all-False mask (no packing), and proving them all 0 is what lets their causal
    attention mask be recognised (codegen/constfold.py)."""
    value = constant_value(x, g.bodies)
    if type(value) not in (int, bool):
        return None
    shape, dtype = out_shape(metas), out_dtype(metas)
    d, c = dim % len(shape), int(value)
    return g.pointwise(shape, dtype, lambda h, idx: h.to_dtype(
        h.index_expr(c * (idx[d] + 1), torch.int64), dtype), "cumsum")
