"""Scaled-dot-product attention calls (an extern) as lowering places them: masks that export
can prove are no-ops or causal are replaced by what eager code passes, so SDPA keeps its fused
kernels, and on the CPU the output slot records where the machine's SDPA puts its result.
`g` is the GraphLowering whose values, realized bodies and facts are consulted. (Hand-written
attention becomes an SDPA call before lowering: codegen/attention_fusion.py.)
"""
from __future__ import annotations

import sympy
import torch

from aotc.codegen.constfold import UNKNOWN, at_sample, constant_value, is_causal_mask
from aotc.codegen.ir import dims, size_texts, sym


def simplify_attention_mask(g, node: dict) -> dict:
    """SDPA's attention mask, when export can prove what it is, replaced by what eager
    execution would have passed: nothing for a mask that masks nothing (all True; all 0
    when additive), `is_causal=True` for the causal mask `j <= i`. Traced transformers
    materialize such masks (`arange(n) >= 0`, `kv_idx <= q_idx`, expanded) where eager
    code skips them, and a mask keeps SDPA from its flash kernels: on an H200 at batch 32
    the masked call of ViT-B/16 ran at half eager's speed."""
    from aotc.codegen.graph import TensorValue   # graph.py calls this module
    args, kwargs = list(node["args"]), dict(node["kwargs"])
    get = lambda i, name, default: (args[i] if len(args) > i   # noqa: E731
                                    else kwargs.get(name, default))
    mask = get(3, "attn_mask", None)
    if not (isinstance(mask, dict) and "slot" in mask):
        return node
    sid = mask["slot"]
    tv = g.env[sid]
    if sid not in g.mask_facts:
        value = constant_value(tv, g.bodies) if isinstance(tv, TensorValue) else UNKNOWN
        no_op = value is True if tv.dtype == torch.bool else (
            tv.dtype.is_floating_point and value is not UNKNOWN and value == 0)
        g.mask_facts[sid] = "none" if no_op else "causal" if (
            isinstance(tv, TensorValue) and is_causal_mask(tv, g.bodies)) else None
    fact = g.mask_facts[sid]
    causal = fact == "causal" and get(4, "dropout_p", 0.0) == 0.0 \
        and get(5, "is_causal", False) is False and _same_length(g, args, tv)
    if fact != "none" and not causal:
        return node

    def put(i: int, name: str, value) -> None:
        if len(args) > i:
            args[i] = value
        else:
            kwargs[name] = value
    put(3, "attn_mask", None)
    if causal:
        put(5, "is_causal", True)
    return dict(node, args=args, kwargs=kwargs)

def _same_length(g, args: list, mask) -> bool:
    """Query length == key length == the mask's last two dims (SDPA's is_causal aligns the
    mask's top left corner; only a square mask is `j <= i` both ways)."""
    from aotc.codegen.graph import TensorValue
    q, k = (g.env[a["slot"]] if isinstance(a, dict) else None for a in args[:2])
    if not (isinstance(q, TensorValue) and isinstance(k, TensorValue)):
        return False
    sizes = {sympy.sympify(x) for x in (q.shape[-2], k.shape[-2], *mask.shape[-2:])}
    return len(sizes) == 1


def output_dim_order(g, node: dict) -> tuple[int, ...] | None:
    """The memory order (outermost first) of the output this machine's SDPA returns for the
    call `node`, found by running it on tiny inputs of the same kinds (dtype, mask dtype,
    causal, scale, GQA). CPU flash attention writes (batch, seq, heads, dim) and returns it
    transposed to (batch, heads, seq, dim); a plan that assumed a contiguous output copied it
    (`layout`) and then copied it again into the (batch, seq, heads*dim) a projection reads.
    None where the call is not 4-d or the probe fails; a runtime whose SDPA answers in another
    layout still gets a copy, never a wrong read (runtime/executor.py `layout`)."""
    from aotc.codegen.graph import TensorValue
    args, kwargs = list(node["args"]), dict(node["kwargs"])
    get = lambda i, name, default: (args[i] if len(args) > i   # noqa: E731
                                    else kwargs.get(name, default))
    q, k, v = (g.env[a["slot"]] if isinstance(a, dict) and "slot" in a else None
               for a in args[:3])
    if not all(isinstance(t, TensorValue) and len(t.shape) == 4 for t in (q, k, v)):
        return None
    mask = get(3, "attn_mask", None)
    mask_tv = g.env[mask["slot"]] if isinstance(mask, dict) and "slot" in mask else None
    if mask is not None and not isinstance(mask_tv, TensorValue):
        return None
    gqa = bool(get(7, "enable_gqa", False))

    def like(a, heads):
        """Zeros of (1, heads, 4, 8) laid out in the memory order of the argument's value
        (the kernels choose by layout: flash answers in its query's order)."""
        meta = g.values[a["slot"]] or {}
        stride = [at_sample(sym(x)) for x in meta.get("stride", ())]
        order = sorted(range(4), key=lambda d: (-stride[d], d)) if len(stride) == 4 else \
            list(range(4))
        sizes = (1, heads, 4, 8)
        t = torch.zeros([sizes[d] for d in order], dtype=g.env[a["slot"]].dtype)
        return t.permute([order.index(d) for d in range(4)])
    try:
        tq, tk, tv_ = like(args[0], 2), like(args[1], 1 if gqa else 2), \
            like(args[2], 1 if gqa else 2)
        tm = None if mask_tv is None else torch.zeros((1,) * (len(mask_tv.shape) - 2) + (4, 4),
                                                      dtype=mask_tv.dtype)
        if tm is not None and tm.dtype == torch.bool:
            tm = ~tm
        out = torch.ops.aten.scaled_dot_product_attention.default(
            tq, tk, tv_, tm, float(get(4, "dropout_p", 0.0)), bool(get(5, "is_causal", False)),
            scale=get(6, "scale", None), enable_gqa=gqa)
    except Exception:   # noqa: BLE001 - a probe: any failure keeps the contiguous layout
        return None
    order = sorted(range(4), key=lambda d: (-out.stride(d), d))
    return tuple(order)


def place_sdpa_output(g, node: dict) -> None:
    """The output slot of an SDPA call records the layout this machine's SDPA returns
    (`output_dim_order`), so kernels read it where it lies. Graph outputs keep eager's
    recorded strides."""
    from aotc.codegen.graph import _is_contiguous
    out, = node["out"]
    slot = g.plan.slot(out)
    order = None if out in g.graph_outputs or not slot.is_tensor else output_dim_order(g, node)
    if order is None or order == (0, 1, 2, 3):
        return
    shape = dims(slot.shape)
    stride, step = [None] * 4, sympy.Integer(1)
    for d in reversed(order):
        stride[d], step = step, step * shape[d]
    g.plan.update(out, stride=size_texts(stride), contiguous=_is_contiguous(shape, stride))
