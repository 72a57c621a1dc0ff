"""Reduction lowerings: sum/mean/prod/amax/amin/any/all, var/var_mean, argmax/argmin, softmax,
log_softmax, layer/group/batch norm. Each builds `Reduction` nodes whose bodies inline their
producers (prologue fusion) and returns lazy pointwise epilogues that the scheduler fuses with
the reduction's loop.
"""
from __future__ import annotations

import torch

from aotc.codegen.ir import Op, ReductionType as R, product, sym
from aotc.codegen.lowering import out_dtype, out_shape, register, size_args

aten = torch.ops.aten
LOW_PRECISION = (torch.float16, torch.bfloat16)


def _dims(x, dims) -> list[int]:
    if dims is None or dims == []:
        return list(range(len(x.shape)))
    if not x.shape:   # a 0-d tensor reduced over dim 0 or -1 is itself
        return []
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % max(len(x.shape), 1) for d in dims})


def acc_dtype(dtype) -> torch.dtype:
    return torch.float32 if dtype in LOW_PRECISION else dtype


def reduce(g, x, dims, rtype, dtype, origin, fn=None, outputs=1, out_dtypes=None):
    """Reduce `x` (or body `fn(h, full_index)`) over `dims`. Returns realized TensorValues whose
    shape is x's shape without the reduced dims."""
    kept = [d for d in range(len(x.shape)) if d not in dims]
    ranges = [x.shape[d] for d in kept]
    rranges = [x.shape[d] for d in dims]
    load = fn or (lambda h, full: h.to_dtype(x.loader(h, full), dtype))

    def body(h, idx, ridx):
        full = [None] * len(x.shape)
        for d, i in zip(kept, idx):
            full[d] = i
        for d, r in zip(dims, ridx):
            full[d] = r
        return load(h, tuple(full))
    return g.reduction(ranges, rranges, rtype, dtype, body, origin, outputs, out_dtypes)


def keepdim_view(g, red, shape, dims):
    """View a reduced value (reduced dims dropped) with size-1 dims at `dims`."""
    load = red.loader
    kept = [d for d in range(len(shape)) if d not in dims]
    fn = lambda h, idx: load(h, tuple(idx[d] for d in kept))
    return g.view(red, shape, fn, ("aten::view.default", [size_args(shape)], {}))


def _finish(g, metas, red, dims, keepdim, post=None, origin="reduce"):
    shape, dtype = out_shape(metas), out_dtype(metas)
    if post is not None or red.dtype != dtype:
        load = red.loader
        red = g.pointwise(red.shape, dtype,
                          lambda h, i: h.to_dtype(post(h, load(h, i)) if post else load(h, i),
                                                  dtype), origin)
    return keepdim_view(g, red, shape, dims) if keepdim and dims else red


@register(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default,
          aten.prod.dim_int, aten.prod.default, aten.amax.default, aten.amin.default,
          aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.default,
          aten.all.dims)
def simple_reduction(g, metas, x, dims=None, keepdim=False, *, dtype=None):
    op = g.current_op
    name = op._schema.name.split("::")[1]
    if op in (aten.prod.dim_int, aten.any.dim, aten.all.dim) and isinstance(dims, int):
        dims = [dims]
    if isinstance(dims, torch.dtype) or isinstance(keepdim, torch.dtype):
        return None
    rtype = {"sum": R.SUM, "mean": R.SUM, "prod": R.PROD, "amax": R.MAX, "amin": R.MIN,
             "any": R.ANY, "all": R.ALL}[name]
    dims = _dims(x, dims)
    out = out_dtype(metas)
    acc = torch.bool if rtype in (R.ANY, R.ALL) else acc_dtype(out)
    red, = reduce(g, x, dims, rtype, acc, name)
    post = None
    if name == "mean":
        n = product(x.shape[d] for d in dims)
        post = lambda h, v: h.op(Op.TRUEDIV, v, h.index_expr(n, acc))
    if not len(x.shape):
        keepdim = False
    return _finish(g, metas, red, dims, keepdim, post, name)


@register(aten.var.correction, aten.var_mean.correction)
def var(g, metas, x, dims=None, *, correction=None, keepdim=False):
    dims = _dims(x, dims)
    acc = acc_dtype(out_dtype(metas))
    mean, m2 = reduce(g, x, dims, R.WELFORD, acc, "var", outputs=2)
    n = product(x.shape[d] for d in dims)
    corr = 1 if correction is None else correction
    v = _finish(g, metas, m2, dims, keepdim,
                lambda h, m: h.op(Op.TRUEDIV, m, h.op(Op.MAXIMUM, h.op(
                    Op.SUB, h.index_expr(n, acc), h.constant(corr, acc)), h.constant(0, acc))),
                "var")
    if g.current_op == aten.var.correction:
        return v
    return v, _finish(g, metas[1:], mean, dims, keepdim, None, "mean")


@register(aten.argmax.default, aten.argmin.default)
def argreduce(g, metas, x, dim=None, keepdim=False):
    if dim is None:
        return None
    dims = _dims(x, dim)
    rtype = R.ARGMAX if g.current_op == aten.argmax.default else R.ARGMIN
    red, = reduce(g, x, dims, rtype, acc_dtype(x.dtype), "argmax", out_dtypes=[torch.int64])
    return _finish(g, metas, red, dims, keepdim, None, "arg")


def _row_softmax(g, x, dim, dtype):
    """(max, sum of exp(x - max)) over `dim`, as reduced values, in the computation dtype."""
    dims = _dims(x, dim)
    mx, = reduce(g, x, dims, R.MAX, dtype, "softmax_max")
    mx_b = keepdim_view(g, mx, tuple(1 if d in dims else s for d, s in enumerate(x.shape)), dims)
    lx, lm = x.loader, mx_b.loader
    shape = x.shape
    bcast = lambda i: tuple(sym(0) if d in dims else v for d, v in enumerate(i))
    shifted = lambda h, i: h.op(Op.SUB, h.to_dtype(lx(h, i), dtype), lm(h, bcast(i)))
    sm, = reduce(g, x, dims, R.SUM, dtype, "softmax_sum",
                 fn=lambda h, i: h.op(Op.EXP, shifted(h, i)))
    sm_b = keepdim_view(g, sm, tuple(1 if d in dims else s for d, s in enumerate(shape)), dims)
    return shifted, sm_b.loader, bcast


@register(aten._softmax.default, aten._log_softmax.default)
def softmax(g, metas, x, dim, half_to_float):
    shape, dtype = out_shape(metas), out_dtype(metas)
    acc = acc_dtype(x.dtype)
    shifted, ls, bcast = _row_softmax(g, x, dim, acc)
    if g.current_op == aten._softmax.default:
        # times the sum's reciprocal, as ATen's vectorized softmax: the reciprocal is invariant
        # in the row's loop, so a kernel divides once per row instead of once per element
        fn = lambda h, i: h.to_dtype(h.op(Op.MUL, h.op(Op.EXP, shifted(h, i)),
                                          h.op(Op.RECIPROCAL, ls(h, bcast(i)))), dtype)
    else:
        fn = lambda h, i: h.to_dtype(h.op(Op.SUB, shifted(h, i), h.op(Op.LOG, ls(h, bcast(i)))),
                                     dtype)
    return g.pointwise(shape, dtype, fn, "softmax")


def _normalize(g, metas, x, dims, eps, weight, bias, wdims, origin):
    """(x - mean) * rsqrt(var + eps) * weight + bias over `dims`; returns (out, mean, rstd)."""
    acc = acc_dtype(x.dtype)
    mean, m2 = reduce(g, x, dims, R.WELFORD, acc, origin, outputs=2)
    n = product(x.shape[d] for d in dims)
    lmean, lm2 = mean.loader, m2.loader
    rstd = g.pointwise(mean.shape, acc, lambda h, i: h.op(Op.RSQRT, h.op(
        Op.ADD, h.op(Op.TRUEDIV, lm2(h, i), h.index_expr(n, acc)), h.constant(eps, acc))),
        origin + "_rstd")
    lrstd = rstd.loader
    kept = [d for d in range(len(x.shape)) if d not in dims]
    shape, dtype = out_shape(metas), out_dtype(metas)
    lx = x.loader
    lw = weight.loader if weight is not None else None
    lb = bias.loader if bias is not None else None

    def fn(h, i):
        row = tuple(i[d] for d in kept)
        v = h.op(Op.MUL, h.op(Op.SUB, h.to_dtype(lx(h, i), acc), lmean(h, row)), lrstd(h, row))
        widx = tuple(i[d] for d in wdims)
        if lw is not None:
            v = h.op(Op.MUL, v, h.to_dtype(lw(h, widx), acc))
        if lb is not None:
            v = h.op(Op.ADD, v, h.to_dtype(lb(h, widx), acc))
        return h.to_dtype(v, dtype)
    out = g.pointwise(shape, dtype, fn, origin)
    return out, mean, rstd


@register(aten.native_layer_norm.default)
def layer_norm(g, metas, x, normalized_shape, weight, bias, eps):
    k = len(normalized_shape)
    dims = list(range(len(x.shape) - k, len(x.shape)))
    out, mean, rstd = _normalize(g, metas, x, dims, eps, weight, bias, dims, "layer_norm")
    stat_shape = out_shape(metas, 1)
    return (out, keepdim_view(g, mean, stat_shape, dims) if g.used(1) else None,
            keepdim_view(g, rstd, stat_shape, dims) if g.used(2) else None)


@register(aten._native_batch_norm_legit_no_training.default)
def batch_norm(g, metas, x, weight, bias, running_mean, running_var, momentum, eps):
    if g.used(1) or g.used(2):
        return None
    shape, dtype = out_shape(metas), out_dtype(metas)
    acc = acc_dtype(x.dtype)
    lx, lm, lv = x.loader, running_mean.loader, running_var.loader
    lw = weight.loader if weight is not None else None
    lb = bias.loader if bias is not None else None

    def fn(h, i):
        c = (i[1],)
        inv = h.op(Op.RSQRT, h.op(Op.ADD, h.to_dtype(lv(h, c), acc), h.constant(eps, acc)))
        v = h.op(Op.MUL, h.op(Op.SUB, h.to_dtype(lx(h, i), acc), h.to_dtype(lm(h, c), acc)), inv)
        if lw is not None:
            v = h.op(Op.MUL, v, h.to_dtype(lw(h, c), acc))
        if lb is not None:
            v = h.op(Op.ADD, v, h.to_dtype(lb(h, c), acc))
        return h.to_dtype(v, dtype)
    return g.pointwise(shape, dtype, fn, "batch_norm"), None, None


@register(aten.native_batch_norm.default)
def native_batch_norm(g, metas, x, weight, bias, running_mean, running_var, training, momentum,
                      eps):
    """Inference batch norm as traced without export (training=False): same as the no-training
    variant; training mode stays an extern call (it updates running statistics)."""
    if training or running_mean is None or running_var is None:
        return None
    return batch_norm(g, metas, x, weight, bias, running_mean, running_var, momentum, eps)
