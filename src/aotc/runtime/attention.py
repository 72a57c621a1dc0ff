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
