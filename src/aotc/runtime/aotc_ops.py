"""Ops of aotc's own that plans may call (`aotc::<name>.<overload>`), implemented here by the
runtime: a fixed table, like the ATen ops of artifact/schema/extern_ops.txt.

`aotc::decode_attention.default(query [B, H, 1, D], key_cache [B, Hkv, M, D], value_cache,
position [1] int64, scale[, window[, softcap[, sinks]]])`: one query token per sequence
attending the cache's keys 0..position (aotc/nn.py; with a window, only the last `window` of
them; with a softcap, scores soft-capped; with sinks [H], one more logit per head). On a CPU
it reads the position (no device to wait for) and attends the valid keys only; elsewhere it
masks the rest of the cache, so no value is read back from the device (CUDA artifacts launch
a flash-decoding kernel instead, codegen/triton/decode_attention.py).

`aotc::sdpa_backward.default(grad, query, key, value, is_causal, scale, enable_gqa[,
attn_mask])`: (dq, dk, dv) of ATen's attention, its forward recomputed under autograd so the
device's fused backward runs (training steps; runtime/attention.py).

`aotc::fft.default(x, dims, mode[, size])`: torch.fft over the dims set in the bitmask `dims`
(runtime/fourier.py).

`aotc::all_reduce.default(x)`: the sum of `x` over the ranks of the default process group of
torch.distributed, as a new tensor (tensor-parallel artifacts, after each row-parallel
projection); `aotc::all_gather.default(x, dim, world)`: the ranks' `x` concatenated along
`dim` (the vocabulary-parallel LM head's logits). The C++ runner runs neither
(runtime/cpp_runner.py says so in `m.runtime`).
"""
from __future__ import annotations

import torch

from aotc.runtime.attention import attention, sdpa_backward, window_mask
from aotc.runtime.fourier import fft
from aotc.artifact.schema.ops import AOTC_OPS
from aotc.artifact.schema.flow import COLLECTIVES   # noqa: F401 - which of OPS are collectives


def _checked(position, key_cache) -> int:
    """The position as an int, in range of the cache (a CPU tensor: reading it costs nothing).
    The module guards positions by the manifest's max_cache_len; a manifest that claims more
    than the plan's cache holds is refused here, before anything is read or written."""
    at, slots = int(position.reshape(-1)[0]), int(key_cache.shape[2])
    if not 0 <= at < slots:
        from aotc.errors import GuardError
        raise GuardError("decode position outside the KV cache", where="aotc::decode_attention",
                         expected=f"0 <= position < {slots} (the cache's slots)", found=at,
                         fix="reset() the module; an artifact whose generation.max_cache_len "
                             "exceeds its cache is damaged: re-export it")
    return at


def decode_attention(query, key_cache, value_cache, position, scale, window=0, softcap=0.0,
                     sinks=None):
    if query.device.type == "cpu":
        n = _checked(position, key_cache) + 1
        lo = max(0, n - window) if window else 0
        return attention(query, key_cache[:, :, lo:n], value_cache[:, :, lo:n], None, scale,
                         softcap, sinks=sinks)
    keys = torch.arange(key_cache.shape[2], device=key_cache.device)
    mask = window_mask(position.reshape(1, 1), keys, window)[None, None]
    return attention(query, key_cache, value_cache, mask, scale, softcap, sinks=sinks)


def decode_attention_write(query, key_cache, value_cache, position, key, value, scale,
                           window=0, softcap=0.0, sinks=None):
    """Write key/value [B, Hkv, 1, D] at `position` of the caches, then attend. Off the CPU
    the position stays on the device: a position past the cache writes nothing (its index is
    clamped and the row there rewritten with itself) rather than out of bounds."""
    if query.device.type == "cpu":
        index = position.reshape(1).new_tensor([_checked(position, key_cache)])
        key_cache.index_copy_(2, index, key)
        value_cache.index_copy_(2, index, value)
    else:
        index = position.reshape(1).clamp(0, key_cache.shape[2] - 1)
        inside = ((position.reshape(1) >= 0) & (position.reshape(1) < key_cache.shape[2]))
        inside = inside.reshape(1, 1, 1, 1)
        for cache, new in ((key_cache, key), (value_cache, value)):
            cache.index_copy_(2, index, torch.where(inside, new, cache.index_select(2, index)))
    return decode_attention(query, key_cache, value_cache, position, scale, window, softcap,
                            sinks)


def all_reduce(x):
    import torch.distributed as dist
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out)
    return out


def all_gather(x, dim, world):
    import torch.distributed as dist
    if world != dist.get_world_size():
        from aotc.errors import ArtifactError
        raise ArtifactError("the plan gathers over another number of ranks than the process "
                            "group has", where="aotc::all_gather", expected=dist.get_world_size(),
                            found=world, fix="re-export the model")
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim)


_FUNCTIONS = {"aotc::all_reduce.default": all_reduce, "aotc::fft.default": fft,
              "aotc::all_gather.default": all_gather,
              "aotc::decode_attention.default": decode_attention,
              "aotc::decode_attention_write.default": decode_attention_write,
              "aotc::sdpa_backward.default": sdpa_backward}
# name: (function, its arguments' kinds, how many are required), the kinds from the schema's
# table (artifact/schema/ops.py)
OPS = {name: (_FUNCTIONS[name], *signature) for name, signature in AOTC_OPS.items()}
