"""transformers decoders (`*ForCausalLM`) adapted to aotc's generator convention.

`HFDecoder(model, batch, max_cache_len)` gives the model one `aotc.nn.KVCache` per layer (sized
from what each layer stores in one eager call of two tokens, not guessed from its config) and
calls it as `forward(input_ids, input_pos) -> logits` (`input_pos` [T], or [batch, T] for a
generator's slots): the model gets `position_ids`, a cache
object whose `update` writes through the KVCaches, and an attention implementation of aotc's
own ("aotc", registered with transformers' AttentionInterface) that attends through them, so
prefill runs causal attention over the prompt and decode reads only the valid prefix of the
cache. With no mask function registered for it, transformers builds no attention mask at all:
a layer's sliding window and score soft-capping reach aotc's attention as the keyword
arguments transformers passes every attention implementation (`sliding_window`, `softcap`),
and an additive bias (ALiBi) is refused. The model's own weights and code are used as they
are; only `config._attn_implementation` is switched while the adapter runs (and a context
object set on its config objects, through which attention finds the caches), and restored.
"""
from __future__ import annotations

import inspect

import torch

from aotc.errors import ExportError
from aotc.nn import KVCache
from aotc.runtime.attention import attention

ATTENTION = "aotc"


def is_hf_causal_lm(model) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    name = type(model).__name__
    return isinstance(model, PreTrainedModel) and (name.endswith("ForCausalLM")
                                                   or name.endswith("LMHeadModel"))


class _Context:
    """What aotc's attention reads while an adapter runs its model: the layers' caches, and
    the positions of this call (set by `HFDecoder.forward` and cleared after it). It hangs
    on the model's config objects, which every transformers attention layer holds, so the
    caches reach attention whether or not the model's layers pass their keyword arguments
    down (StableLM's, Falcon's and Nemotron's do not)."""

    def __init__(self, sliding: dict[int, int], chunked: dict[int, int]):
        self.caches, self.positions = None, None
        self.sliding = sliding     # layer -> the window its config gives it, where it matters
        self.chunked = chunked     # layer -> its attention's chunk, where shorter than the cache
        self.attended: dict[int, int] | None = None   # while probing: layer -> its window


CONTEXT = "_aotc_context"


SERVED_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def _layer_types(cfg) -> list[str]:
    """The config's `layer_types`, checked: a layer of another type than full, sliding-window
    or chunked attention (DeepSeek's indexed sparse attention, linear attention) is refused,
    as is chunked attention without a chunk size: aotc's attention would attend keys theirs
    does not."""
    types = list(getattr(cfg, "layer_types", None) or [])
    other = sorted({t for t in types if t not in SERVED_TYPES})
    if "chunked_attention" in types and not getattr(cfg, "attention_chunk_size", None):
        other.append("chunked_attention without attention_chunk_size")
    if other:
        layers = [i for i, t in enumerate(types) if t not in SERVED_TYPES]
        raise ExportError(f"layers {layers[:8]} attend as {', '.join(other)}, which aotc's "
                          "decoder attention does not compute", where="config.layer_types",
                          expected=" or ".join(SERVED_TYPES), found=", ".join(other),
                          fix="export without --decode")
    return types


def _chunked_layers(cfg, max_cache_len: int) -> dict[int, int]:
    """The layers of chunked attention (Llama 4's) whose chunk is shorter than the cache."""
    chunk = getattr(cfg, "attention_chunk_size", None)
    if not chunk or max_cache_len <= chunk:      # one chunk holds the whole cache: causal
        return {}
    return {i: chunk for i, t in enumerate(_layer_types(cfg)) if t == "chunked_attention"}


def _sliding_layers(cfg, max_cache_len: int) -> dict[int, int]:
    """The layers whose config says they attend a sliding window shorter than the cache (all
    layers, or those `layer_types` calls "sliding_attention")."""
    types = _layer_types(cfg)
    window = getattr(cfg, "sliding_window", None)
    if not window or getattr(cfg, "use_sliding_window", True) is False \
            or max_cache_len <= window:
        return {}
    types = types or ["sliding_attention"] * cfg.num_hidden_layers
    return {i: window for i, t in enumerate(types) if t == "sliding_attention"}


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
               sliding_window=None, softcap=None, s_aux=None, is_causal=None, **kwargs):
    """transformers' attention interface: query [B, H, T, D], key/value what the cache's update
    returned; returns [B, T, H, D] as transformers' SDPA attention does. `s_aux`: attention
    sinks (GPT-OSS), one logit per head."""
    if is_causal is False:
        raise ExportError("the model's attention is bidirectional (is_causal=False), which "
                          "aotc's decoder attention does not compute",
                          where=type(module).__name__, expected="causal attention",
                          found="is_causal=False", fix="export without --decode")
    ctx = getattr(getattr(module, "config", None), CONTEXT, None)
    layer = getattr(module, "layer_idx", None)
    if ctx is None or layer is None:
        raise ExportError("an attention layer of the model cannot be adapted to aotc's cache",
                          where=type(module).__name__, expected="a transformers attention "
                          "layer with `config` and `layer_idx`", found=type(module).__name__,
                          fix="follow aotc/nn.py's convention (samples/llama.py)")
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise ExportError("the model adds a bias to its attention scores (ALiBi or a "
                          "learned bias), which aotc's decoder attention does not apply",
                          where=type(module).__name__, expected="rotary or absolute "
                          "positions (no additive attention bias)",
                          found=f"a {attention_mask.dtype} attention mask",
                          fix="export without --decode")
    if not sliding_window and layer in ctx.sliding:
        raise ExportError(f"layer {layer} attends a sliding window of {ctx.sliding[layer]} "
                          "tokens its attention does not pass on", where=type(module).__name__,
                          expected=f"max_cache_len <= {ctx.sliding[layer]}",
                          found="a longer cache",
                          fix=f"export with --max-cache-len {ctx.sliding[layer]} or less")
    if ctx.attended is not None:          # the probe: causal attention over the new tokens
        ctx.attended[layer] = int(sliding_window or 0)
        scale = scaling or query.shape[-1] ** -0.5
        out = attention(query, key, value, None, scale, softcap or 0.0, causal=True,
                        sinks=s_aux)
        return out.transpose(1, 2), None
    out = ctx.caches[layer].attend(query, key, value, ctx.positions, scaling,
                                   window=sliding_window, softcap=softcap, sinks=s_aux)
    return out.transpose(1, 2), None


class _Cache:
    """What transformers' layers call on `past_key_values`: `update`, answered by the
    KVCaches, and the few queries models make of a cache."""

    is_compileable = True

    def __init__(self, caches, positions):
        self.caches, self.positions = caches, positions

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.caches[layer_idx].update(self.positions, key_states, value_states)

    def get_mask_sizes(self, query_length, layer_idx: int = 0, *args) -> tuple[int, int]:
        return self.get_max_cache_shape(layer_idx), 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.caches[layer_idx].max_cache_len

    def __len__(self) -> int:
        return len(self.caches)


class _Probe(_Cache):
    """The probe call's cache: it keeps nothing, and records what each layer stores."""

    def __init__(self, positions):
        super().__init__(None, positions)
        self.stored: dict[int, tuple] = {}     # layer -> (key, value)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.stored[layer_idx] = (key_states, value_states)
        return key_states, value_states

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return len(self.positions)

    def __len__(self) -> int:
        return len(self.stored)


class HFDecoder(torch.nn.Module):
    def __init__(self, model, batch: int, max_cache_len: int):
        super().__init__()
        from transformers import AttentionInterface
        AttentionInterface.register(ATTENTION, _attention)
        self.model = model
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
            else model.config
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "past_key_values" if "past_key_values" in params else "cache"
        self.previous = model.config._attn_implementation
        self.context = _Context(_sliding_layers(cfg, max_cache_len),
                                _chunked_layers(cfg, max_cache_len))
        self.configs = list({id(c): c for c in (model.config, cfg,
                                                *(getattr(m, "config", None)
                                                  for m in model.modules()))
                             if c is not None}.values())
        # what another adapter of the same model (an eager baseline beside an export, say)
        # set there comes back on release(), so that adapter keeps working
        self.held = [c.__dict__.get(CONTEXT) for c in self.configs]
        for c in self.configs:
            setattr(c, CONTEXT, self.context)
        model.config._attn_implementation = ATTENTION   # until release(): export's duration
        try:
            self.caches = torch.nn.ModuleList(self._probe(batch, max_cache_len))
        except BaseException:
            self.release()
            raise
        self.context.caches = self.caches

    def _probe(self, batch: int, max_cache_len: int) -> list[KVCache]:
        """One eager call of two tokens through a recording cache: a KVCache per layer, of the
        shape and dtype that layer stores; every layer that stores must attend through aotc."""
        name = type(self.model).__name__
        p = next(iter(self.model.parameters()))
        probe = _Probe(torch.arange(2, device=p.device))
        self.context.attended = {}
        try:
            with torch.no_grad():
                self.model(input_ids=torch.zeros(batch, 2, dtype=torch.int64, device=p.device),
                           position_ids=probe.positions.expand(batch, 2), use_cache=True,
                           **{self.cache_kw: probe})
            attended = self.context.attended
        except ExportError:
            raise
        except Exception as e:         # the model's own code, given aotc's attention and cache
            raise ExportError(f"{name} does not run with aotc's attention and cache",
                              where=name, expected="a decoder whose layers attend through "
                              "transformers' attention interface",
                              found=f"{type(e).__name__}: {e}"[:300],
                              fix="export without --decode, or follow aotc/nn.py's "
                                  "convention") from e
        finally:
            self.context.attended = None
        layers = sorted(probe.stored)
        if not layers or layers != list(range(len(layers))) or set(attended) != set(layers):
            raise ExportError(f"{name}'s attention does not run through transformers' "
                              "attention interface and cache", where=name,
                              expected="every layer storing its keys in the cache and "
                              "attending through the configured attention implementation",
                              found=f"layers storing {layers}, attending {sorted(attended)}",
                              fix="export without --decode, or follow aotc/nn.py's convention")
        return [_cache_like(name, i, *probe.stored[i], max_cache_len, attended[i],
                            self.context.chunked.get(i, 0)) for i in layers]

    def release(self) -> None:
        """Give the model back the attention implementation and context it had before."""
        self.model.config._attn_implementation = self.previous
        for c, held in zip(self.configs, self.held):
            if held is None:
                c.__dict__.pop(CONTEXT, None)
            else:
                setattr(c, CONTEXT, held)

    def forward(self, input_ids, input_pos):
        b, t = input_ids.shape
        self.context.positions = input_pos
        try:
            rows = input_pos if input_pos.dim() == 2 else input_pos.reshape(1, t).expand(b, t)
            out = self.model(input_ids=input_ids, position_ids=rows, use_cache=True,
                             **{self.cache_kw: _Cache(self.caches, input_pos)})
        finally:
            self.context.positions = None
        return out.logits


def _cache_like(name: str, layer: int, key, value, max_cache_len: int,
                window: int, chunk: int = 0) -> KVCache:
    """A layer's KVCache for keys and values shaped as the probe's [B, Hkv, 2, D] and
    [B, Hkv, 2, Dv] (multi-head latent attention's values are narrower than its keys; a ring
    of `window` slots for a sliding-window layer whose window is shorter than the cache, of
    `chunk` slots for a chunked-attention layer)."""
    if key.dim() != 4 or value.dim() != 4 or key.shape[:3] != value.shape[:3] \
            or key.dtype != value.dtype:
        raise ExportError(f"layer {layer} of {name} stores keys and values aotc's cache cannot "
                          "hold", where=f"layer {layer}", expected="keys [batch, kv_heads, "
                          "tokens, head_dim] and values [batch, kv_heads, tokens, value_dim] "
                          "of one dtype", found=f"{list(key.shape)} {key.dtype} and "
                          f"{list(value.shape)} {value.dtype}", fix="export without --decode")
    b, heads, _, d = key.shape
    if window and chunk:
        raise ExportError(f"layer {layer} of {name} attends a sliding window and chunks",
                          where=f"layer {layer}", expected="one of the two",
                          found=f"window {window}, chunk {chunk}", fix="export without --decode")
    return KVCache(b, heads, max_cache_len, d, key.dtype, key.device, window=window,
                   value_dim=value.shape[3], chunk=chunk)
