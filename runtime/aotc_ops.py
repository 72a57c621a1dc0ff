"""Ops of aotc's own that plans may call (`aotc::<name>.<overload>`), implemented here by the
runtime: a fixed table, like the ATen ops of runtime/schema/extern_ops.txt.

`aotc::decode_attention.default(query [B, H, 1, D], key_cache [B, Hkv, M, D], value_cache,
position [1] int64, scale)`: one query token per sequence attending the cache's keys
0..position (aotc/nn.py). On a CPU it reads the position (no device to wait for) and runs
ATen's attention over the valid prefix only; elsewhere it masks the rest of the cache, so no
value is read back from the device (CUDA artifacts launch a flash-decoding kernel instead,
codegen/triton/decode_attention.py).

`aotc::all_reduce.default(x)`: the sum of `x` over the ranks of the default process group of
torch.distributed, as a new tensor (tensor-parallel artifacts, after each row-parallel
projection); `aotc::all_gather.default(x, dim, world)`: the ranks' `x` concatenated along
`dim` (the vocabulary-parallel LM head's logits). The C++ runner runs neither
(runtime/cpp_runner.py says so in `m.runtime`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from aotc.runtime.schema.flow import COLLECTIVES   # noqa: F401 - which of OPS are collectives


def decode_attention(query, key_cache, value_cache, position, scale):
    gqa = query.shape[1] != key_cache.shape[1]
    if query.device.type == "cpu":
        n = int(position.reshape(-1)[0]) + 1
        return F.scaled_dot_product_attention(query, key_cache[:, :, :n],
                                              value_cache[:, :, :n], scale=scale,
                                              enable_gqa=gqa)
    keys = torch.arange(key_cache.shape[2], device=key_cache.device)
    mask = (keys <= position.reshape(1)).reshape(1, 1, 1, -1)
    return F.scaled_dot_product_attention(query, key_cache, value_cache, attn_mask=mask,
                                          scale=scale, enable_gqa=gqa)


def decode_attention_write(query, key_cache, value_cache, position, key, value, scale):
    """Write key/value [B, Hkv, 1, D] at `position` of the caches, then attend."""
    index = position.reshape(1)
    key_cache.index_copy_(2, index, key)
    value_cache.index_copy_(2, index, value)
    return decode_attention(query, key_cache, value_cache, position, scale)


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


OPS = {"aotc::all_reduce.default": (all_reduce, 1),      # name: (function, arity)
       "aotc::all_gather.default": (all_gather, 3),
       "aotc::decode_attention.default": (decode_attention, 5),
       "aotc::decode_attention_write.default": (decode_attention_write, 7)}
