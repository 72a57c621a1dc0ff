"""Attention arithmetic shared by the runtime's own ops (runtime/aotc_ops.py) and the decoders'
building blocks (aotc/nn.py), so eager generation and a loaded artifact compute alike: causal
masks with an optional sliding window, scores with an optional soft cap, and attention sinks
(a learned logit per head that joins every softmax and takes its share of the weight).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def window_mask(positions: torch.Tensor, keys: torch.Tensor, window: int = 0,
                chunk: int = 0) -> torch.Tensor:
    """[T, K] bool: the keys each query (at `positions` [T, 1]) attends, causally and, with
    `window` > 0, only the last `window` positions (as transformers' sliding windows do);
    with `chunk` > 0, only those of its own chunk of `chunk` positions (Llama 4's chunked
    attention)."""
    mask = keys[None, :] <= positions
    if chunk:
        floor = lambda x: torch.div(x, chunk, rounding_mode="floor")   # noqa: E731
        mask = mask & (floor(keys)[None, :] == floor(positions))
    return mask & (keys[None, :] > positions - window) if window else mask


def attention(q, k, v, mask, scale: float, softcap: float = 0.0, causal: bool = False,
              sinks=None):
    """softmax(q k^T * scale [softcapped] + mask) v for q [B, H, T, D], k, v [B, Hkv, K, D];
    `mask` a bool [.., T, K] (or None with `causal`); `sinks` [H]: one more logit per head in
    each softmax, whose weight is dropped. Without a softcap or sinks, ATen's attention."""
    gqa = q.shape[1] != k.shape[1]
    if not softcap and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              scale=scale, enable_gqa=gqa)
    if gqa:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:
        sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1,
                                dtype=torch.float32)[..., :-1]
    return torch.matmul(weights.to(q.dtype), v)


def sdpa_backward(grad, q, k, v, is_causal: int, scale: float, enable_gqa: int = 0, mask=None):
    """(dq, dk, dv) of ATen's attention `out = sdpa(q, k, v, mask, is_causal, scale)` for the
    gradient `grad` of `out`: the forward recomputed under autograd, whose backward is the
    device's fused one (flash or memory-efficient on a GPU, flash on a CPU), so a training
    step saves q, k and v rather than the [T, K] weights, and its backward never materializes
    them. Contiguous results, as the op's fake implementation promises (exporter)."""
    with torch.inference_mode(False), torch.enable_grad():
        own = lambda t: t.clone() if t.is_inference() else t.detach()   # noqa: E731
        q, k, v = (own(t).requires_grad_() for t in (q, k, v))
        grad = grad.clone() if grad.is_inference() else grad
        mask = own(mask) if mask is not None else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(is_causal),
                                             scale=scale, enable_gqa=bool(enable_gqa))
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()
