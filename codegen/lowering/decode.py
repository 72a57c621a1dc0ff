"""Lowering of aotc's decode attention (`aotc::decode_attention`, aotc/nn.py).

On CUDA targets it becomes the hand-written flash-decoding kernels of
codegen/triton/decode_attention.py, which read only the cache's valid prefix over a static
grid; elsewhere it stays a call of the runtime's own op (runtime/aotc_ops.py), which on a CPU
attends the valid prefix with ATen's attention.
"""
from __future__ import annotations

import torch

import aotc.nn  # noqa: F401 - registers the op
from aotc.codegen.ir import contiguous_strides, sym
from aotc.codegen.lowering import register


def dense(g, tv):
    """A Buffer holding `tv` densely (row-major, size-1 dims aside), copying only if needed."""
    buf = tv.buffer if tv.buffer is not None else g._buffer(g.materialize(tv))
    want = contiguous_strides(buf.shape)
    if all(sym(n) == 1 or sym(s) == w for n, s, w in zip(buf.shape, buf.stride, want)):
        return buf
    copy = g.pointwise(tv.shape, tv.dtype, tv.loader, "contiguous")
    return g.realize(copy)


@register(torch.ops.aotc.decode_attention_write.default)
def decode_attention_write(g, metas, q, k_cache, v_cache, position, key, value, scale,
                           window=0, softcap=0.0, sinks=None):
    """The cache writes of a decode step done by its attention kernel (codegen/state.py)."""
    return decode_attention(g, metas, q, k_cache, v_cache, position, scale, window, softcap,
                            sinks, new=(key, value))


@register(torch.ops.aotc.decode_attention.default)
def decode_attention(g, metas, q, k_cache, v_cache, position, scale, window=0, softcap=0.0,
                     sinks=None, new=()):
    if not g.split_reductions:      # not a CUDA target: the runtime's op
        return None
    from aotc.codegen.triton.decode_attention import decode_attention_kernels, partial_shapes
    if not all(isinstance(d, int) or getattr(d, "is_Integer", False)
               for t in (q, k_cache, v_cache) for d in t.shape):
        return None
    qb, kb, vb, pb, *nb = (dense(g, t) for t in (q, k_cache, v_cache, position, *new))
    partials = [g._buffer(g.new_slot(tuple(sym(d) for d in shape), torch.float32))
                for shape in partial_shapes(qb, kb, vb)]
    out = g._buffer(g.new_slot((*qb.shape[:3], vb.shape[3]), q.dtype))
    for b in (*partials, out):
        g.out.slots[b.slot]["producer"] = "kernel"
    sb = dense(g, sinks) if sinks is not None else None
    g.out.steps.extend(decode_attention_kernels(qb, kb, vb, pb, partials, out, scale, nb,
                                                window=window, softcap=softcap, sinks=sb))
    return g.realized(out.slot)
