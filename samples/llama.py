"""A small LLaMA-style decoder in plain torch, with its own static KV cache.

    aotc export samples/llama.py:Net --example-input 1x128:int64:0..31999 --decode \\
        --max-cache-len 2048 -o llm.aotc
    aotc generate llm.aotc --prompt-len 128 --new-tokens 256

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, as LLaMA-2/3.
It follows aotc's convention for generators (aotc/nn.py): `setup_caches(batch, max_cache_len)`
gives every attention layer an `aotc.nn.KVCache`, and `forward(input_ids, input_pos)` takes the
token ids [batch, T] and their positions [T] (or [batch, T]: a position per row, for
`--max-batch`). Without caches, forward is plain causal attention over its input (then
`input_pos` may be left out). The default sizes are small, for CPUs and tests; `--init-args '{"size": "1b"}'` gives the ~1B configuration of the GPU benchmark
(hidden 2048, 16 layers, 32 heads over 8 KV heads, vocab 32000) and "7b" LLaMA-2-7B's.
`window` (a sliding window of that many positions, as Mistral's and Gemma's local layers),
`softcap` (attention scores soft-capped, as Gemma 2's) and `sinks` (a learned logit per head in
every softmax, as GPT-OSS's) are off by default.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from aotc.nn import KVCache, attention, window_mask

SIZES = {
    "small": dict(vocab=32000, dim=256, layers=4, heads=8, kv_heads=2, hidden=688),
    "1b": dict(vocab=32000, dim=2048, layers=16, heads=32, kv_heads=8, hidden=5632),
    "7b": dict(vocab=32000, dim=4096, layers=32, heads=32, kv_heads=32, hidden=11008),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rotary_tables(head_dim: int, max_len: int, base: float = 10000.0):
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(max_len).float(), inv)
    return torch.cos(angles), torch.sin(angles)


def rotate(x, cos, sin):
    """x [B, H, T, D]; cos/sin [T, D/2] (or [B, T, D/2]: a position per row, a generator's
    slots): rotate (even, odd) pairs as LLaMA's reference does."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos.unsqueeze(-3).to(x.dtype), sin.unsqueeze(-3).to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, window: int = 0,
                 softcap: float = 0.0, sinks: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.window, self.softcap = window, softcap
        self.sinks = nn.Parameter(torch.zeros(heads)) if sinks else None
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.cache: KVCache | None = None

    def forward(self, x, cos, sin, input_pos):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.cache is not None:
            k, v = self.cache.update(input_pos, k, v)
            y = self.cache.attend(q, k, v, input_pos, window=self.window, softcap=self.softcap,
                                  sinks=self.sinks)
        else:
            mask = window_mask(input_pos[:, None], input_pos, self.window) if self.window \
                else None
            y = attention(q, k, v, mask, self.head_dim ** -0.5, self.softcap, causal=mask is None,
                          sinks=self.sinks)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden, window=0, softcap=0.0, sinks=False):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, window, softcap, sinks)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin, input_pos):
        x = x + self.attn(self.attn_norm(x), cos, sin, input_pos)
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Net(nn.Module):
    def __init__(self, size: str = "small", max_len: int = 4096, **overrides):
        super().__init__()
        cfg = dict(SIZES[size], **overrides)
        self.config = cfg
        self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.layers = nn.ModuleList(Block(cfg["dim"], cfg["heads"], cfg["kv_heads"], cfg["hidden"],
                                          cfg.get("window", 0), cfg.get("softcap", 0.0),
                                          cfg.get("sinks", False))
                                    for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["dim"])
        self.output = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
        cos, sin = rotary_tables(cfg["dim"] // cfg["heads"], max_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():     # a scale that keeps random logits informative
            if p.dim() == 2:
                nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))

    def setup_caches(self, batch_size: int, max_cache_len: int):
        p = self.output.weight
        for block in self.layers:
            a = block.attn
            a.cache = KVCache(batch_size, a.kv_heads, max_cache_len, a.head_dim, p.dtype, p.device,
                              window=a.window)

    def forward(self, input_ids, input_pos=None):
        if input_pos is None:
            input_pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids)
        cos, sin = self.cos[input_pos], self.sin[input_pos]
        for block in self.layers:
            x = block(x, cos, sin, input_pos)
        return self.output(self.norm(x))
