"""Attention arithmetic shared by the runtime's own ops (runtime/aotc_ops.py) and the decoders'
building blocks (aotc/nn.py), so eager generation and a loaded artifact compute alike: causal
masks with an optional sliding window, and scores with an optional soft cap.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def window_mask(positions: torch.Tensor, keys: torch.Tensor, window: int = 0) -> torch.Tensor:
    """[T, K] bool: the keys each query (at `positions` [T, 1]) attends, causally and, with
    `window` > 0, only the last `window` positions (as transformers' sliding windows do)."""
    mask = keys[None, :] <= positions
    return mask & (keys[None, :] > positions - window) if window else mask


def attention(q, k, v, mask, scale: float, softcap: float = 0.0, causal: bool = False):
    """softmax(q k^T * scale [softcapped] + mask) v for q [B, H, T, D], k, v [B, Hkv, K, D];
    `mask` a bool [.., T, K] (or None with `causal`). Without a softcap, ATen's attention."""
    gqa = q.shape[1] != k.shape[1]
    if not softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              scale=scale, enable_gqa=gqa)
    if gqa:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)
