"""Capture of a decoder as a generator: two entries over one set of weights and one state.

    prefill(input_ids [B, T]) -> logits [B, vocab]   writes the cache at 0..T-1, position := T
    decode(input_ids [B, 1])  -> logits [B, vocab]   writes the cache at position, position += 1

Each entry's plan also computes the greedy token, the logits' argmax [B, 1] (`token=True`): a
second flat output the output tree leaves out (the manifest's generation.token names it).

With slots (`--max-batch N`, continuous batching) the cache holds N sequences, each at its own
position (the position state is int64 [N]):

    prefill(input_ids [1, T], slot [1], start [1]) -> logits [1, vocab]
        writes the prompt (or a chunk of it) into cache slot `slot` at start..start+T-1,
        attending that slot's cache up to each token; position[slot] := start + T
    decode(input_ids [N, 1]) -> logits [N, vocab]
        every slot at its own position; position := min(position + 1, max_cache_len - 1)
        (the runtime keeps live slots inside the cache; a free slot's writes are never read)
    decode_K(input_ids [K, 1]) -> logits [K, vocab]
        the same for slots 0..K-1 only (`--slot-buckets`: the runtime runs the smallest that
        holds every slot in use; each replays its own CUDA graph)

Both steps wrap the same `Generator` (the decoder with its `aotc.nn.KVCache`s, and the position
as an int64 buffer), so their captured graphs name the same weights and the same state; the
state buffers are what the graphs mutate (torch.export's buffer mutations). Prompt length is a
dynamic dim of prefill; decode has static shapes. A decoder is either one that follows aotc's
convention (`setup_caches` and `forward(input_ids, input_pos)`, aotc/nn.py) or a transformers
`*ForCausalLM`, adapted by `HFDecoder` (exporter/hf_decoder.py).
"""
from __future__ import annotations

import inspect

import torch

from aotc.errors import ExportError, UsageError
from aotc.nn import KVCache, SlotTarget, set_mode

PREFIX = "m.g."           # what capture's wrappers put before the generator's own names


class Generator(torch.nn.Module):
    """The decoder, its caches, and the position of the next token (state)."""

    def __init__(self, decoder: torch.nn.Module, max_cache_len: int, slots: int = 0,
                 buckets: tuple[int, ...] = ()):
        super().__init__()
        self.decoder = decoder
        self.max_cache_len, self.slots, self.buckets = max_cache_len, slots, buckets
        device = next(iter(decoder.parameters())).device
        self.register_buffer("pos", torch.zeros(max(slots, 1), dtype=torch.int64,
                                                device=device), persistent=False)
        self.target = SlotTarget() if slots else None
        for c in (m for m in decoder.modules() if isinstance(m, KVCache)) if slots else ():
            if c.ring:
                raise ExportError("--max-batch needs full-length caches; a layer keeps a ring "
                                  "(a sliding window or chunks shorter than the cache)",
                                  where="KVCache", expected=f"a cache of {max_cache_len} "
                                  "positions", found=f"a ring of {c.ring}",
                                  fix=f"export with --max-cache-len {c.ring} or less, or "
                                      "without --max-batch")
            c.target = self.target


class PrefillStep(torch.nn.Module):
    """A prompt's step: its last position's logits, and with `token` their argmax [B, 1] too
    (the greedy token, the manifest's generation.token: an argmax kernel of the plan, which a
    greedy step on a GPU chains to the logits' kernels instead of an eager argmax after them)."""

    def __init__(self, g: Generator, token: bool = False):
        super().__init__()
        self.g, self.token = g, token

    def forward(self, input_ids):
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)
        logits = self.g.decoder(input_ids, positions)
        self.g.pos.fill_(t)
        return picked(logits[:, -1], self.token)


class DecodeStep(PrefillStep):
    """One token's step; its outputs as PrefillStep's."""

    def forward(self, input_ids):
        logits = self.g.decoder(input_ids, self.g.pos)
        self.g.pos.add_(1)
        return picked(logits[:, -1], self.token)


class SlotPrefillStep(PrefillStep):
    """A prompt, or a chunk of one, into one slot of a generator with slots (module doc)."""

    def forward(self, input_ids, slot, start):
        t = input_ids.shape[1]
        positions = start + torch.arange(t, device=input_ids.device)
        self.g.target.slot = slot
        try:
            logits = self.g.decoder(input_ids, positions)
        finally:
            self.g.target.slot = None
        self.g.pos.index_put_((slot,), positions[-1:] + 1)   # start + t, as a tensor op
        return picked(logits[:, -1], self.token)


class SlotDecodeStep(PrefillStep):
    """One token for every slot, each at its own position (module doc); with `rows`, for the
    first `rows` slots only (a decode bucket: the others keep their state)."""

    def __init__(self, g: Generator, token: bool = False, rows: int | None = None):
        super().__init__(g, token)
        self.rows = rows

    def forward(self, input_ids):
        pos = self.g.pos if self.rows is None else self.g.pos[:self.rows]
        logits = self.g.decoder(input_ids, pos[:, None])
        pos.copy_((pos + 1).clamp(max=self.g.max_cache_len - 1))
        return picked(logits[:, -1], self.token)


def picked(logits: torch.Tensor, token: bool):
    return (logits, logits.argmax(-1, keepdim=True)) if token else logits


def adapt(model: torch.nn.Module, batch: int, max_cache_len: int) -> torch.nn.Module:
    """The decoder as `forward(input_ids, input_pos) -> logits [B, T, vocab]` with its caches
    set up for `batch` sequences of up to `max_cache_len` tokens."""
    if callable(getattr(model, "setup_caches", None)):
        params = list(inspect.signature(model.forward).parameters)
        if len(params) < 2:
            raise ExportError("the decoder's forward takes no positions", where="forward",
                              expected="forward(input_ids, input_pos)", found=params,
                              fix="follow the convention of aotc/nn.py (samples/llama.py)")
        model.setup_caches(batch, max_cache_len)
        if not [m for m in model.modules() if isinstance(m, KVCache)]:
            raise ExportError("setup_caches created no aotc.nn.KVCache", where="setup_caches",
                              expected="one KVCache per attention layer", found="none",
                              fix="keep each attention layer's cache in an aotc.nn.KVCache")
        return model
    from aotc.exporter.hf_decoder import HFDecoder, is_hf_causal_lm
    if is_hf_causal_lm(model):
        return HFDecoder(model, batch, max_cache_len)
    raise UsageError(f"{type(model).__name__} cannot be exported for decoding",
                     where="decode=True", expected="a transformers *ForCausalLM, or a decoder "
                     "with setup_caches() and forward(input_ids, input_pos)",
                     found=type(model).__name__,
                     fix="follow the convention of aotc/nn.py (samples/llama.py is an example)")


def eager_generate(g: Generator, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy tokens of the generator run eagerly (caches in eager mode): [B, prompt + new]."""
    if g.slots:
        return eager_slot_generate(g, input_ids, new_tokens)
    set_mode(g, "eager")
    reset_state(g)
    with torch.no_grad():
        logits = PrefillStep(g)(input_ids)
        out = [input_ids]
        for _ in range(new_tokens):
            token = logits.argmax(-1, keepdim=True)
            out.append(token)
            if len(out) - 1 == new_tokens:
                break
            logits = DecodeStep(g)(token)
    reset_state(g)
    return torch.cat(out, dim=1)


def eager_slot_generate(g: Generator, input_ids: torch.Tensor, new_tokens: int
                        ) -> torch.Tensor:
    """eager_generate over slots: row i's prompt into slot i, then every slot decoded at once
    (the slots past the batch decode token 0 from position 0: free slots, never read)."""
    set_mode(g, "eager")
    reset_state(g)
    b, dev = input_ids.shape[0], input_ids.device
    one = lambda i: torch.tensor([i], device=dev)     # noqa: E731
    with torch.no_grad():
        tokens = torch.zeros(g.slots, 1, dtype=torch.int64, device=dev)
        for row in range(b):
            tokens[row] = SlotPrefillStep(g)(input_ids[row:row + 1], one(row), one(0)).argmax(-1)
        out = [input_ids]
        for i in range(new_tokens):
            out.append(tokens[:b].clone())
            if i + 1 < new_tokens:
                tokens = SlotDecodeStep(g)(tokens).argmax(-1, keepdim=True)
    reset_state(g)
    return torch.cat(out, dim=1)


def reset_state(g: Generator) -> None:
    for name, buf in state_buffers(g).items():
        buf.zero_()


def state_buffers(g: Generator) -> dict[str, torch.Tensor]:
    """The generator's state, by the names its captured graphs give it (without PREFIX)."""
    out = {"pos": g.pos}
    for name, m in g.named_modules():
        if isinstance(m, KVCache):
            out[f"{name}.k"] = m.k
            out[f"{name}.v"] = m.v
    return out


def export_generator(model: torch.nn.Module, example_inputs: tuple, options, *,
                     source=None, value_ranges=None):
    """Capture `model` as a generator Program (prefill and decode entries, shared weights and
    state). `example_inputs` is one prompt of token ids [batch, T] (T >= 2: prompt length is
    a dynamic dim)."""
    from aotc.exporter import _check_inputs, _source_file
    from aotc.exporter.genprogram import build_program
    args = _check_inputs(example_inputs)
    if len(args) != 1 or args[0].dtype != torch.int64 or args[0].dim() != 2:
        raise UsageError("a generator takes one input: token ids [batch, prompt]",
                         where="example inputs", expected="one int64 tensor [batch, T]",
                         found=[f"{a.dtype}{list(a.shape)}" for a in args],
                         fix="pass the prompt's token ids, e.g. --example-input 1x128:int64:0..31999")
    ids, max_len = args[0], options.max_cache_len
    if not 2 <= ids.shape[1] < max_len:
        raise UsageError(f"the example prompt has {ids.shape[1]} tokens", where="example input",
                         expected=f"2 <= prompt < max_cache_len ({max_len})",
                         found=ids.shape[1], fix="give a prompt of at least 2 tokens, shorter "
                                                 "than --max-cache-len")
    slots = options.max_batch
    if slots and ids.shape[0] > slots:
        raise UsageError(f"the example prompt's batch of {ids.shape[0]} exceeds --max-batch "
                         f"{slots}", where="example input", expected=f"batch <= {slots}",
                         found=ids.shape[0], fix="give a prompt of batch 1")
    model.eval()
    g = Generator(adapt(model, slots or ids.shape[0], max_len), max_len, slots,
                  options.bucket_rows())
    src = source.rpartition(":")[0] if source else None
    from pathlib import Path
    src_file = Path(src) if src else _source_file(model)
    try:
        samples = eager_generate(g, ids, min(16, max_len - ids.shape[1])) \
            if options.record_samples else None
        return build_program(g, ids, options, src_file=src_file, source=source,
                             value_ranges=value_ranges, samples=samples)
    finally:
        set_mode(g, "eager")
        reset_state(g)
        if hasattr(g.decoder, "release"):
            g.decoder.release()
