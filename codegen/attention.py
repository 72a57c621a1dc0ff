"""Graph rewrites of scaled-dot-product attention calls (an extern): masks that export can
prove are no-ops or causal are replaced by what eager code passes, so SDPA keeps its fused
kernels. `g` is the GraphLowering whose values, realized bodies and facts are consulted.
"""
from __future__ import annotations

import sympy
import torch

from aotc.codegen.constfold import UNKNOWN, constant_value, is_causal_mask


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
