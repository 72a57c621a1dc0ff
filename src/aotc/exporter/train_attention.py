"""Attention in training captures, kept fused.

AOTAutograd traces `F.scaled_dot_product_attention` through the dispatcher, which picks the
capturing machine's kernel (the CPU's flash kernel, whose backward op runs nowhere else) or,
forced to its math form, materializes the [T, K] weights and saves them for backward. Neither
fits a step exported on one machine for another. Here the call is kept whole instead:

- forward: aotc's mirror op (`aotc::sdpa`, exporter/decomp.py), which plans call as ATen's
  `scaled_dot_product_attention`, so the loading device picks its fused kernel;
- backward: `aotc::sdpa_backward(grad, q, k, v, is_causal, scale, enable_gqa[, mask])`, which
  the runtime runs by recomputing the forward under autograd (runtime/attention.py): the
  device's fused backward, with q, k and v saved rather than the weights.

Calls the op cannot take (dropout, a mask that itself needs a gradient) stay on the math path.
"""
from __future__ import annotations

import math

import torch

from aotc.exporter.decomp import _sdpa
from aotc.runtime.attention import sdpa_backward

# ATen's scaled_dot_product_attention's arguments, in order, with their defaults (aotc::sdpa
# takes the same, by the same names)
_SDPA_PARAMS = {a.name: a.default_value for a in
                torch.ops.aten.scaled_dot_product_attention.default._schema.arguments}


@torch.library.custom_op("aotc::sdpa_backward", mutates_args=())
def _sdpa_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, is_causal: int, scale: float, enable_gqa: int,
                   attn_mask: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return sdpa_backward(grad, query, key, value, is_causal, scale, enable_gqa, attn_mask)


@_sdpa_backward.register_fake
def _sdpa_backward_fake(grad, query, key, value, is_causal, scale, enable_gqa, attn_mask=None):
    return tuple(t.new_empty(t.shape) for t in (query, key, value))


def _setup(ctx, inputs, output):
    query, key, value, attn_mask, _, is_causal, scale, enable_gqa = inputs
    ctx.save_for_backward(query, key, value, attn_mask)
    ctx.is_causal, ctx.scale, ctx.enable_gqa = int(is_causal), scale, int(enable_gqa)


def _backward(ctx, grad):
    query, key, value, attn_mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.aotc.sdpa_backward(grad, query, key, value, ctx.is_causal, ctx.scale,
                                              ctx.enable_gqa, attn_mask)
    return dq, dk, dv, None, None, None, None, None


_sdpa.register_autograd(_backward, setup_context=_setup)


def _fused_call(args: tuple, kwargs: dict):
    """aotc::sdpa's arguments for an F.scaled_dot_product_attention call, or None where the
    call needs the math path (dropout; a mask that needs a gradient)."""
    bound = dict(zip(_SDPA_PARAMS, args), **kwargs)
    if set(bound) - set(_SDPA_PARAMS):
        return None
    call = {name: bound.get(name, default) for name, default in _SDPA_PARAMS.items()}
    mask = call["attn_mask"]
    if call["dropout_p"] or (mask is not None and mask.requires_grad):
        return None
    if call["scale"] is None:
        call["scale"] = 1.0 / math.sqrt(call["query"].shape[-1])
    return call


def keep_attention(gm: torch.fx.GraphModule) -> int:
    """Point `gm`'s attention calls (ATen's scaled_dot_product_attention, as export captures
    F.scaled_dot_product_attention) at `_attention`: how many there were."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"
             and n.target is torch.ops.aten.scaled_dot_product_attention.default]
    for node in calls:
        node.target = _attention
    if calls:
        gm.recompile()
    return len(calls)


def _attention(*args, **kwargs):
    call = _fused_call(args, kwargs)
    if call is None:
        return torch.ops.aten.scaled_dot_product_attention.default(*args, **kwargs)
    return torch.ops.aotc.sdpa(**call)
