"""View lowerings: index remaps. A view's loader reads its base at remapped indices, so kernels
never copy; its recipe (the ATen view call) is replayed only if an extern op needs the tensor.
"""
from __future__ import annotations

import torch

import sympy

from aotc.codegen.ir import (contiguous_strides, index_vars, linear_index, product, provable_max,
                             provably_nonnegative, simplify_index, sym, unravel)
from aotc.codegen.lowering import out_shape, register, size_args

aten = torch.ops.aten


def _recipe(g):
    node = g.current_node
    return node["op"], node["args"][1:], node["kwargs"]


def _view(g, x, shape, remap, recipe=None):
    load = x.loader
    return g.view(x, shape, lambda h, idx: load(h, remap(idx)), recipe or _recipe(g))


@register(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def view(g, metas, x, size):
    shape = out_shape(metas)
    if tuple(shape) == tuple(x.shape):
        return _view(g, x, shape, lambda idx: idx)
    out_strides = contiguous_strides(shape)
    remap = simplified(lambda idx: tuple(unravel(linear_index(idx, out_strides), x.shape)),
                       shape)
    return _view(g, bounded(g, x, remap, shape), shape, remap,
                 ("aten::view.default", [size_args(shape)], {}))


INDEX_LIMIT = 64   # sympy ops in a load index past which a reshape realizes its lazy base


def bounded(g, x, remap, shape):
    """`x`, realized first if reading it through `remap` gives a load index of more than
    INDEX_LIMIT ops. Folding cannot shorten every composition (the channel shuffle's
    c -> 4*(c % 2) + c // 2 reads its argument twice, so k stacked shuffles over pointwise
    ops between them double the index k times); a buffer restarts the index, so export time
    stays linear in the number of views."""
    if x.buffer is not None:
        return x
    from aotc.codegen.scheduler import LoadRecorder
    rec = LoadRecorder()
    vs = index_vars("view", len(shape))
    x.loader(rec, remap(vs))
    if max((sympy.count_ops(i) for _, i in rec.loads), default=0) <= INDEX_LIMIT:
        return x
    return g.realized(g.realize(x).slot)


def simplified(remap, shape):
    """`remap` folded once over fresh index variables in `shape`'s ranges, then instantiated
    with each caller's index. A reshape's unravel of its flattened index nests FloorDiv and
    ModIndex over its argument, so stacked reshapes (ShuffleNet's channel shuffle, window
    partitions) left unsimplified grow exponentially with their depth; folded (splits and
    merges of dims cancel) each level adds a term or two."""
    vs = index_vars("view", len(shape))
    ranges = dict(zip(vs, (sym(d) for d in shape)))
    if any(sym(d) == 0 for d in shape):    # no elements: nothing is indexed (and a reshape's
        return lambda idx: (sympy.Integer(0),) * len(remap(vs))   # unravel divides by 0)
    template = tuple(simplify_index(sympy.sympify(e), ranges) for e in remap(vs))
    return lambda idx: tuple(e.xreplace(dict(zip(vs, map(sympy.sympify, idx))))
                             for e in template)


NHWC_TO_NCHW = [0, 3, 1, 2]


@register(aten.permute.default)
def permute(g, metas, x, dims):
    dims = [d % len(x.shape) for d in dims]
    inverse = [dims.index(i) for i in range(len(dims))]
    out = _view(g, x, out_shape(metas), lambda idx: tuple(idx[inverse[i]]
                                                          for i in range(len(dims))))
    # [N, H, W, C] data seen as [N, C, H, W] is channels-last data, as a channels-last
    # convolution's output is (ConvNeXt's blocks: the MLP over channels, permuted back, then
    # the layer scale and the residual add): what is computed from it is stored channels-last
    # too, so the next depthwise convolution gets its layout and the add reads and writes
    # along the channels, instead of a transposing NCHW store and a convolution that
    # converts its input
    out.channels_last = g.channels_last and dims == NHWC_TO_NCHW
    return out


@register(aten.t.default, aten.transpose.int)
def transpose(g, metas, x, d0=0, d1=1):
    n = len(x.shape)
    if n < 2:
        return _view(g, x, out_shape(metas), lambda idx: idx)
    d0, d1 = d0 % n, d1 % n

    def remap(idx):
        idx = list(idx)
        idx[d0], idx[d1] = idx[d1], idx[d0]
        return tuple(idx)
    return _view(g, x, out_shape(metas), remap)


@register(aten.expand.default)
def expand(g, metas, x, size, implicit=False):
    shape = out_shape(metas)
    off = len(shape) - len(x.shape)
    return _view(g, x, shape, lambda idx: tuple(
        sym(0) if x.shape[j] == 1 and shape[j + off] != 1 else idx[j + off]
        for j in range(len(x.shape))))


@register(aten.unsqueeze.default)
def unsqueeze(g, metas, x, dim):
    dim = dim % (len(x.shape) + 1)
    return _view(g, x, out_shape(metas), lambda idx: tuple(idx[:dim]) + tuple(idx[dim + 1:]))


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(g, metas, x, dims=None):
    n = len(x.shape)
    if n == 0:   # squeezing a 0-d tensor (dim 0 or -1) is the identity
        return _view(g, x, out_shape(metas), lambda idx: idx)
    if dims is None:
        dims = [d for d in range(n) if x.shape[d] == 1]
    dims = {d % n for d in ([dims] if isinstance(dims, int) else dims) if x.shape[d % n] == 1}
    kept = [d for d in range(n) if d not in dims]

    def remap(idx):
        full = [sym(0)] * n
        for d, i in zip(kept, idx):
            full[d] = i
        return tuple(full)
    return _view(g, x, out_shape(metas), remap)


def _slice_view(g, x, shape, dim, start, step, recipe=None):
    def remap(idx):
        idx = list(idx)
        idx[dim] = idx[dim] * step + start
        return tuple(idx)
    return _view(g, x, shape, remap, recipe)


@register(aten.slice.Tensor)
def slice_(g, metas, x, dim=0, start=None, end=None, step=1):
    """A view reading the base from `start` on (the length is the traced output's). On a dim of
    symbolic size n, a start such as 1, -1 or n - 1 is placed by ATen's rules only where that is
    provable for every n; anything else stays ATen's slice."""
    dim = dim % len(x.shape)
    start = _position(0 if start is None else start, x.shape[dim], clamp=True)
    if start is None or not isinstance(step, int):
        return None
    return _slice_view(g, x, out_shape(metas), dim, start, step)


@register(aten.select.int)
def select(g, metas, x, dim, index):
    dim = dim % len(x.shape)
    index = _position(index, x.shape[dim], clamp=False)
    if index is None:
        return None
    return _view(g, x, out_shape(metas), lambda idx: tuple(idx[:dim]) + (index,)
                 + tuple(idx[dim:]))


def _position(i, size, clamp: bool):
    """Where index `i` of a dim of `size` lands by ATen's rules, as a sympy expression: a
    negative index counts from the end; a slice's start (`clamp`) is then raised to 0 (ATen
    also lowers it to `size`, but a start past the end leaves the slice empty, so nothing is
    read from it); a select's index must be inside the dim. None where a rule's branch is not
    provable for every size (a slice's `-3` on a dim of size n >= 1: is n - 3 negative?)."""
    i, size = sym(i), sym(size)
    if provably_nonnegative(-i - 1):
        i = i + size
    elif not provably_nonnegative(i):
        return None
    if clamp:
        return provable_max(sym(0), i)
    return i if provably_nonnegative(i) and provably_nonnegative(size - 1 - i) else None


@register(aten.split.Tensor, aten.split_with_sizes.default)
def split(g, metas, x, sizes, dim=0):
    dim = dim % len(x.shape)
    outs, start = [], 0
    for i, meta in enumerate(metas):
        shape = out_shape(metas, i)
        length = shape[dim]
        recipe = ("aten::slice.Tensor", [dim, *size_args([start, start + length]), 1], {})
        outs.append(_slice_view(g, x, shape, dim, start, 1, recipe))
        start += length
    return outs


@register(aten.unbind.int)
def unbind(g, metas, x, dim=0):
    dim = dim % len(x.shape)
    return [_view(g, x, out_shape(metas, i),
                  (lambda k: lambda idx: tuple(idx[:dim]) + (sym(k),) + tuple(idx[dim:]))(i),
                  ("aten::select.int", [dim, i], {})) for i in range(len(metas))]


del product
