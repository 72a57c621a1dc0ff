"""transformers decoders (`*ForCausalLM`) adapted to aotc's generator convention.

`HFDecoder(model, batch, max_cache_len)` gives the model one `aotc.nn.KVCache` per layer and
calls it as `forward(input_ids, input_pos) -> logits`: the model gets `position_ids`, a cache
object whose `update` writes through the KVCaches, and an attention implementation of aotc's
own ("aotc", registered with transformers' AttentionInterface) that attends through them, so
prefill runs causal attention over the prompt and decode reads only the valid prefix of the
cache. With no mask function registered for it, transformers builds no attention mask at all.
The model's own weights and code are used as they are; only `config._attn_implementation` is
switched while the adapter runs, and restored.
"""
from __future__ import annotations

import inspect

import torch

from aotc.errors import ExportError
from aotc.nn import KVCache

ATTENTION = "aotc"


def is_hf_causal_lm(model) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    name = type(model).__name__
    return isinstance(model, PreTrainedModel) and (name.endswith("ForCausalLM")
                                                   or name.endswith("LMHeadModel"))


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
               aotc_positions=None, aotc_caches=None, **kwargs):
    """transformers' attention interface: query [B, H, T, D], key/value what the cache's update
    returned; returns [B, T, H, D] as transformers' SDPA attention does."""
    if kwargs.get("softcap") is not None:
        raise ExportError("attention logit soft-capping is not supported by aotc's decoder",
                          where=type(module).__name__, expected="no softcap",
                          found=kwargs["softcap"], fix="export without --decode")
    if aotc_caches is None:
        raise ExportError("the model does not pass its keyword arguments down to attention",
                          where=type(module).__name__, expected="transformers >= 5 attention "
                          "(AttentionInterface)", found="no aotc_caches keyword",
                          fix="upgrade transformers, or follow aotc/nn.py's convention")
    cache = aotc_caches[module.layer_idx]
    out = cache.attend(query, key, value, aotc_positions, scaling)
    return out.transpose(1, 2), None


class _Cache:
    """What transformers' layers call on `past_key_values`: `update`, answered by the
    KVCaches, and the few queries models make of a cache."""

    is_compileable = True

    def __init__(self, caches, positions):
        self.caches, self.positions = caches, positions

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.caches[layer_idx].update(self.positions, key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.caches[layer_idx].max_cache_len

    def __len__(self) -> int:
        return len(self.caches)


class HFDecoder(torch.nn.Module):
    def __init__(self, model, batch: int, max_cache_len: int):
        super().__init__()
        from transformers import AttentionInterface
        AttentionInterface.register(ATTENTION, _attention)
        self.model = model
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
            else model.config
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        window = getattr(cfg, "sliding_window", None)
        if window is not None and getattr(cfg, "use_sliding_window", True) \
                and max_cache_len > window:
            raise ExportError(f"{type(model).__name__} attends a sliding window of {window} "
                              "tokens", where="max_cache_len", expected=f"<= {window}",
                              found=max_cache_len,
                              fix=f"export with --max-cache-len {window} or less")
        p = next(iter(model.parameters()))
        self.caches = torch.nn.ModuleList(
            KVCache(batch, kv_heads, max_cache_len, head_dim, p.dtype, p.device)
            for _ in range(cfg.num_hidden_layers))
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "past_key_values" if "past_key_values" in params else "cache"
        self.previous = model.config._attn_implementation
        model.config._attn_implementation = ATTENTION   # until release(): export's duration

    def release(self) -> None:
        """Give the model back its own attention implementation."""
        self.model.config._attn_implementation = self.previous

    def forward(self, input_ids, input_pos):
        b, t = input_ids.shape
        out = self.model(input_ids=input_ids, position_ids=input_pos.reshape(1, t).expand(b, t),
                         use_cache=True, aotc_positions=input_pos, aotc_caches=self.caches,
                         **{self.cache_kw: _Cache(self.caches, input_pos)})
        return out.logits
