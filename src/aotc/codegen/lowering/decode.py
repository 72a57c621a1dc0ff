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
from aotc.artifact.schema.plan import CallStep, slot_refs
from aotc.artifact.schema.types import StepKind


def _is_dense(buf) -> bool:
    want = contiguous_strides(buf.shape)
    return all(sym(n) == 1 or sym(s) == w for n, s, w in zip(buf.shape, buf.stride, want))


def dense(g, tv):
    """A Buffer holding `tv` densely (row-major, size-1 dims aside), copying only if needed."""
    buf = tv.buffer if tv.buffer is not None else g.buffer(g.materialize(tv))
    if _is_dense(buf):
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
    # a computed q and new key (a rotary embedding of the product's rows, say) are computed by
    # the split kernel itself, where it would have loaded them from a kernel of their own
    qb, *nb = (prologue(t, role) or dense(g, t) for t, role in zip((q, *new[:1]), "qk"))
    kb, vb, pb, *rest = (dense(g, t) for t in (k_cache, v_cache, position, *new[1:]))
    nb += rest
    partials = [g.buffer(g.new_slot(tuple(sym(d) for d in shape), torch.float32))
                for shape in partial_shapes(q, kb, vb)]
    out = g.buffer(g.new_slot((*q.shape[:3], vb.shape[3]), q.dtype))
    for b in (*partials, out):
        g.plan.update(b.slot, producer=StepKind.KERNEL)
    sb = dense(g, sinks) if sinks is not None else None
    early = bool(nb) and not written_before(g.out.steps, {kb.slot, vb.slot, pb.slot})
    g.out.steps.extend(decode_attention_kernels(qb, kb, vb, pb, partials, out, scale, nb,
                                                window=window, softcap=softcap, sinks=sb,
                                                early=early))
    return g.realized(out.slot)


def written_before(steps: list, slots: set) -> bool:
    """Whether one of `steps` may write a slot of `slots`: a node or kernel storing into it or
    into a view of it (a hand-written kernel's in-place writes included), or an extern call
    naming it or a view of it at all (in-place ops return nothing to tell them by). Views are
    followed from their bases."""
    from aotc.codegen.ir import ComputedBuffer
    from aotc.codegen.scheduler import Kernel
    watched = set(slots)
    for step in steps:
        if isinstance(step, ComputedBuffer):
            outs = {b.slot for b in step.buffers}
        elif isinstance(step, Kernel):
            outs = {b.slot for b in (*step.writes, *getattr(step, "mutates", ()))}
        elif isinstance(step, CallStep) and step.kind is StepKind.VIEW:
            if set(slot_refs(step.args)) & watched:
                watched |= {o for o in step.out if o is not None}
            continue
        elif isinstance(step, CallStep):
            outs = {*step.reads(), *(o for o in step.out if o is not None)}
        else:
            continue
        if outs & watched:
            return True
    return False


def prologue(tv, role: str = "q"):
    """A computed q or key (a rotary embedding of the product's rows, say) as a Prologue the
    split kernel computes itself, where it would have loaded it from a kernel of its own (that
    kernel's launch cost more than its work: codegen/triton/prologue.py); None for a buffer,
    a view of one, or a value of dynamic size."""
    from aotc.codegen.triton.prologue import make_prologue
    if not _computed(tv):
        return None
    return make_prologue(f"prologue_{role}", tv.shape, tv.dtype, tv.loader, tv.origins)


def _computed(tv) -> bool:
    """Whether `tv` is a body to compute (or a view of one), not a buffer or a view of one."""
    while tv.buffer is None and tv.view_of is not None:
        tv = tv.view_of[0]
    return tv.buffer is None


def fence_early_reads(steps: list) -> list[str]:
    """Keep `early` (decode attention reading the position and caches before its PDL wait) only
    where that is safe across runs too, and say which way each went. Within a run the lowering
    proved that no step before such a kernel writes them; across runs, the last writes of the
    run before must be complete when the kernel starts. An extern step (an ATen call, launched
    without PDL, so the launches after it follow its completion in stream order) after every
    step that writes them gives that: a generator's plan ends with the position's write-back,
    an extern copy. Without one, the kernels wait first. Returns the decisions."""
    early = [s for s in steps if getattr(s, "early", False)]
    if not early:
        return []
    read = {b.slot for s in early for b in s.read_early}
    externs = [i for i, s in enumerate(steps)
               if isinstance(s, CallStep) and s.kind is StepKind.EXTERN]
    fenced = bool(externs) and not written_before(steps[externs[-1] + 1:], read)
    for s in early:
        s.early = fenced
        s.reasons.append("reads the position and cache before the PDL wait" if fenced else
                         "waits first: no extern step follows the last write of its state")
    return [f"{s.name}: {s.reasons[-1]}" for s in early]
