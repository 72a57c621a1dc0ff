"""Building blocks for decoders that aotc exports as generators (`aotc export --decode`).

`KVCache` is a static key/value cache for one attention layer: two buffers [batch, kv_heads,
max_cache_len, head_dim] (values may have their own head size, `value_dim`, as multi-head
latent attention's in DeepSeek-V2/V3), written in place at the positions of the tokens a call processes
(`update`) and read by attention (`attend`). Eagerly it is an ordinary module: `update`
writes the given positions and returns the whole cache, `attend` masks out keys after each
query's position, so a model built on it runs and generates as is. When aotc exports a
generator it sets each cache's `mode` for the entry it captures:

  * "prefill" (positions 0..T-1): the new keys and values are written to the first T slots and
    attention runs causally over them alone (no read of the cache);
  * "decode" (one token at a position kept in the artifact's state): the key and value are
    written at that position and attention reads only the keys up to it, through
    `aotc::decode_attention` (a flash-decoding kernel on GPUs, ATen's attention over the valid
    prefix on CPUs), never the unused rest of the cache.

Generators with slots (`--max-batch N`, continuous batching): the cache's batch is N slots,
each at its own position. A decode step gives the decoder positions [N, 1] (a 2-D `input_pos`
is per row: each row's key and value written at its own position, each row attending its own
prefix, by masked attention over the cache); a prompt (or a chunk of one) is written into one
slot, which the step names in the caches' shared `SlotTarget` while it runs: its keys go to
that slot at `input_pos` [T], and it attends the slot's cache up to each token's position.

`KVCache(..., window=W)` with W < max_cache_len is a ring of W slots (position p in slot
p % W): a sliding-window layer holds only what it can attend. `attend(..., window=W)` attends
only the last W positions (a sliding window, as Mistral's and Gemma's local layers),
`attend(..., softcap=C)` soft-caps the scores (C * tanh(s / C), as Gemma 2), and
`attend(..., sinks=S)` gives each head's softmax one more logit S[h] whose weight goes to no
value (GPT-OSS); in every mode, so eager generation and the artifact agree.
`attention` and `window_mask` (from runtime/attention.py) are the same arithmetic for a model's
own use.

The convention for plain-torch decoders (samples/llama.py follows it): the model's attention
layers keep their caches in `KVCache` modules and call `update` and `attend`;
`model.setup_caches(batch_size, max_cache_len)` creates them; `model(input_ids, input_pos)`
takes token ids [batch, T] and their positions [T] (int64; or [batch, T], a position per row,
for a generator with slots: rotary tables indexed by them must broadcast per row) and returns
logits [batch, T, vocab].
transformers decoders need nothing of this: aotc adapts them (exporter/generate.py).
"""
from __future__ import annotations

import torch

from aotc.runtime.attention import attention, window_mask

MODES = ("eager", "prefill", "decode")


@torch.library.custom_op("aotc::decode_attention", mutates_args=())
def decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     position: torch.Tensor, scale: float, window: int = 0,
                     softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per sequence attending keys 0..position of the caches (with `window`
    > 0, only the last `window` of them: position - window < key <= position; with `softcap`
    > 0, scores become softcap * tanh(score / softcap) before the softmax; with `sinks` [H],
    each head's softmax has one more logit, whose weight goes to no value).
    query [B, H, 1, D]; key cache [B, Hkv, M, D], value cache [B, Hkv, M, Dv] (H a multiple of
    Hkv); position [1] int64; the result [B, H, 1, Dv]."""
    keys = torch.arange(key_cache.shape[2], device=key_cache.device)
    return attention(query, key_cache, value_cache,
                     window_mask(position.reshape(1, 1), keys, window)[None, None], scale,
                     softcap, sinks=sinks)


@decode_attention.register_fake
def _decode_attention_fake(query, key_cache, value_cache, position, scale, window=0,
                           softcap=0.0, sinks=None):
    return query.new_empty(*query.shape[:-1], value_cache.shape[-1])


@torch.library.custom_op("aotc::decode_attention_write", mutates_args=("key_cache",
                                                                       "value_cache"))
def decode_attention_write(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, position: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, scale: float, window: int = 0,
                           softcap: float = 0.0, sinks: torch.Tensor | None = None
                           ) -> torch.Tensor:
    """`decode_attention` after writing key/value [B, Hkv, 1, D] at `position` of the caches:
    codegen fuses a decode step's cache writes into its attention (codegen/state.py)."""
    key_cache.index_copy_(2, position.reshape(1), key)
    value_cache.index_copy_(2, position.reshape(1), value)
    return decode_attention(query, key_cache, value_cache, position, scale, window, softcap,
                            sinks)


@decode_attention_write.register_fake
def _decode_attention_write_fake(query, key_cache, value_cache, position, key, value, scale,
                                 window=0, softcap=0.0, sinks=None):
    return query.new_empty(*query.shape[:-1], value_cache.shape[-1])


@torch.library.custom_op("aotc::fft", mutates_args=())
def fft(x: torch.Tensor, dims: int, mode: int, size: int = 0) -> torch.Tensor:
    """torch.fft over the dims set in the bitmask `dims`, on real or complex-as-pairs values
    (runtime/fourier.py says how `mode` encodes the transform): what the exporter writes for
    torch.fft's transforms (exporter/fft.py), run by torch at call time."""
    from aotc.runtime.fourier import fft as run
    return run(x, dims, mode, size)


@fft.register_fake
def _fft_fake(x, dims, mode, size=0):
    from aotc.runtime.fourier import fft_shape
    shape, dtype = fft_shape(x, dims, mode, size)
    return x.new_empty(shape, dtype=dtype)


@torch.library.custom_op("aotc::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of `x` over the ranks of a tensor-parallel artifact, as a new tensor (functional,
    so capture keeps it as one step of the graph). Export traces one rank in one process, where
    the sum over that rank alone is `x`; the runtime's implementation (runtime/aotc_ops.py)
    reduces over torch.distributed's default process group."""
    return x.clone()


@all_reduce.register_fake
def _all_reduce_fake(x):
    return torch.empty_like(x)


@torch.library.custom_op("aotc::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, dim: int, world: int) -> torch.Tensor:
    """The `world` ranks' `x` concatenated along `dim`, rank 0's first (a tensor-parallel
    artifact's vocabulary-parallel LM head). Export's stand-in, in one process: `world` copies
    of `x`; the runtime's (runtime/aotc_ops.py) gathers over torch.distributed's default group."""
    return torch.cat([x] * world, dim)


@all_gather.register_fake
def _all_gather_fake(x, dim, world):
    shape = list(x.shape)
    shape[dim] *= world
    return x.new_empty(shape)


class SlotTarget:
    """The slot a prompt step writes (a traced int64 [1]) while it runs, None otherwise: one
    object shared by a generator's caches (a plain object, so capture sees no module
    attribute change)."""

    def __init__(self):
        self.slot = None


class KVCache(torch.nn.Module):
    """A static KV cache of one attention layer (see the module doc). With `window` shorter
    than `max_cache_len` (a sliding-window layer) it is a ring of `window` slots: position p
    lives in slot p % window, and the slots a step may attend are exactly the window's.
    With `chunk` shorter than `max_cache_len` (Llama 4's chunked attention: a token attends
    the earlier tokens of its own chunk of `chunk` positions) it is a ring of `chunk` slots
    too: the chunk of position p starts in slot 0, so a step attends slots 0..p % chunk.
    `value_dim` (default `head_dim`): the values' head size, where it differs from the keys'."""

    def __init__(self, batch_size: int, kv_heads: int, max_cache_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None, window: int = 0,
                 value_dim: int | None = None, chunk: int = 0):
        super().__init__()
        if window and chunk:
            raise ValueError("a KVCache has a sliding window or chunks, not both")
        self.chunk = chunk if 0 < chunk < max_cache_len else 0
        self.ring = (window if 0 < window < max_cache_len else 0) or self.chunk
        self.length = max_cache_len
        shape = (batch_size, kv_heads, self.ring or max_cache_len)
        for name, d in (("k", head_dim), ("v", value_dim or head_dim)):
            self.register_buffer(name, torch.zeros(*shape, d, dtype=dtype, device=device),
                                 persistent=False)
        self.mode = "eager"
        self.target: SlotTarget | None = None    # set for a generator with slots

    @property
    def max_cache_len(self) -> int:
        return self.length

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write keys/values [B, Hkv, T, D] at `input_pos` [T]; the keys and values attention
        reads: the new ones in prefill mode (and for a ring's prompt), the whole cache
        otherwise."""
        t = k.shape[2]
        rows = self._rows(input_pos)
        if rows is not None:
            positions = input_pos if input_pos.dim() == 2 else input_pos[None]
            self.k[rows, :, positions] = k.transpose(1, 2)   # [R, T, Hkv, D] at (row, pos)
            self.v[rows, :, positions] = v.transpose(1, 2)
            if input_pos.dim() == 2:          # the first R rows (a decode bucket: R < N)
                r = input_pos.shape[0]
                return (self.k, self.v) if r == self.k.shape[0] else (self.k[:r], self.v[:r])
            row = rows.reshape(1)                  # a slot's prompt: that slot's cache
            return self.k.index_select(0, row), self.v.index_select(0, row)
        if self._ring_prompt(t):
            self._check_prompt(input_pos)
            sources = self._ring_sources(t, k.device)   # a prompt: its last `ring` tokens
            self.k.copy_(k.index_select(2, sources))
            self.v.copy_(v.index_select(2, sources))
            return k, v
        if self.mode == "prefill":
            self.k[:, :, :t].copy_(k)
            self.v[:, :, :t].copy_(v)
            return k, v
        index = input_pos % self.ring if self.ring else input_pos
        self.k.index_copy_(2, index, k)
        self.v.index_copy_(2, index, v)
        return self.k, self.v

    def _rows(self, input_pos: torch.Tensor) -> torch.Tensor | None:
        """The cache rows [R, 1] a call writes one by one: every row where positions are per
        row ([B, T]), the target slot during a slot's prompt step; None otherwise."""
        slot = self.target.slot if self.target is not None else None
        if slot is None and input_pos.dim() != 2:
            return None
        if self.ring:
            raise ValueError("a KVCache ring (a sliding window or chunks) holds no slots: "
                             "per-row positions need a full-length cache")
        if slot is not None:
            return slot.reshape(1, 1)
        return torch.arange(input_pos.shape[0], device=input_pos.device)[:, None]

    def _ring_sources(self, t, device) -> torch.Tensor:
        """For each ring slot s, the last prompt position p < t with p % ring == s (a slot no
        position reaches yet takes position t - 1: it is written before it is read). Tensor
        arithmetic alone, so a symbolic prompt length takes no branch and no guard."""
        slots = torch.arange(self.ring, device=device)
        end = torch.arange(t, device=device).amax(0, keepdim=True)      # [t - 1]
        back = torch.div((end - slots).clamp(min=0), self.ring, rounding_mode="floor")
        return torch.minimum(slots + back * self.ring, end)

    def _ring_prompt(self, t) -> bool:
        """Whether a call of `t` tokens is a ring cache's prompt (attended over its own new
        keys) rather than a step over the ring."""
        return bool(self.ring) and (self.mode == "prefill" or (self.mode == "eager" and t > 1))

    def _check_prompt(self, input_pos: torch.Tensor) -> None:
        if self.mode == "eager" and int(input_pos[0]) != 0:
            raise ValueError("a ring KVCache (a sliding window or chunks) takes several "
                             "tokens at once only as a prompt from position 0")

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               input_pos: torch.Tensor, scale: float | None = None, window: int | None = None,
               softcap: float | None = None, sinks: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Attention of queries [B, H, T, D] at `input_pos` over what `update` returned;
        `window`: attend only the last `window` positions (a sliding window, as transformers'
        `sliding_window`); `softcap`: scores soft-capped (Gemma 2's attention); `sinks` [H]:
        a learned logit per head in every softmax (GPT-OSS's attention sinks). A chunked
        cache attends each token's own chunk."""
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        window, softcap = int(window or 0), float(softcap or 0.0)
        t = q.shape[2]
        if input_pos.dim() == 2 or (self.target is not None and self.target.slot is not None):
            positions = input_pos if input_pos.dim() == 2 else input_pos[None]   # [R, T]
            keys = torch.arange(k.shape[2], device=k.device)
            mask = window_mask(positions[..., None], keys, window)            # [R, T, M]
            return attention(q, k, v, mask[:, None], scale, softcap, sinks=sinks)
        if self.ring and (window or self.ring) != self.ring or (self.chunk and window):
            raise ValueError(f"a KVCache ring of {self.ring} slots attended with a window of "
                             f"{window}")
        window = window or (self.ring if not self.chunk else 0)
        prompt = self._ring_prompt(t)
        if self.ring and not prompt:   # one token over the ring: its written slots (a window's
            input_pos = input_pos % self.chunk if self.chunk \
                else input_pos.clamp(max=self.ring - 1)          # or its chunk's so far)
            window = 0
        extra = (window, softcap, sinks) if sinks is not None else \
            (window, softcap) if softcap else (window,) if window else ()
        if self.mode == "decode":     # the extra arguments only where set: plans stay as they were
            return torch.ops.aotc.decode_attention(q, k, v, input_pos, scale, *extra)
        if self.mode == "prefill" and not window and not self.chunk:
            return attention(q, k, v, None, scale, softcap, causal=True, sinks=sinks)
        positions = (torch.arange(t, device=q.device) if self.mode == "prefill" or prompt
                     else input_pos)[:, None]
        keys = torch.arange(k.shape[2], device=k.device)
        mask = window_mask(positions, keys, window, self.chunk if prompt else 0)
        return attention(q, k, v, mask[None, None], scale, softcap, sinks=sinks)


def set_mode(model: torch.nn.Module, mode: str) -> list[KVCache]:
    """Set every KVCache of `model` to `mode`; the caches."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    caches = [m for m in model.modules() if isinstance(m, KVCache)]
    for c in caches:
        c.mode = mode
    return caches
