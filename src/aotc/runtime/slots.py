"""A generator's cache slots at run time (continuous batching; `aotc export --max-batch N`).

An artifact with slots (manifest generation.slots = N, format 22) holds N sequences in its
cache, each at its own position. Two calls drive them (exporter/generate.py says what the
entries compute):

    outs = m.prefill_slot(prompt_ids [1, T], slot, start=0)  # a prompt (or the chunk of one
                                                              # at `start`) into one slot
    outs = m.decode_slots(tokens [N, 1])   # one token for every slot at its own position
    m.copy_slot(source, dest)              # a slot's cache and position into another slot

Each returns the entry's flat outputs: logits ([1, vocab] / [N, vocab]), then the greedy token
([1, 1] / [N, 1]). The other slots keep their state across a slot's prefill. The module keeps
every slot's position on the host, so a write past the cache is a GuardError before anything
runs; a slot nobody uses advances too (its writes are never read: a prefill starts it again).
`generate` and `stream` on such an artifact run each row of the batch in its own slot, so the
rows' prompts may differ in length: left-padded, with transformers' `attention_mask`
(`SlotBatch`). aotc.serve's engine drives the slots for many requests at once.
"""
from __future__ import annotations

import contextlib

import torch

from aotc.errors import GuardError, UsageError
from aotc.runtime.graphs import StickyFlag


class SlotMethods:
    """GenerativeModule's calls on slots (a mixin: the module's lock, entries and state)."""

    @property
    def slots(self) -> int:
        """How many sequences the cache holds, each at its own position (0: no slots)."""
        return self.generation.slots or 0

    def slot_position(self, slot: int) -> int:
        """The position of slot `slot`'s next token (its prompt and tokens so far)."""
        return self.slot_positions[slot]

    def prefill_slot(self, input_ids: torch.Tensor, slot: int, start: int = 0) -> list:
        """Write the prompt `input_ids` [1, T] into cache slot `slot` at positions
        start..start+T-1 (start > 0: the next chunk of a long prompt): the flat outputs,
        logits of its last token [1, vocab] and their argmax [1, 1]. The slot's position
        becomes start + T; the other slots keep theirs."""
        self._need_slots("prefill_slot")
        t = input_ids.shape[1] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 \
            else 1
        self._check_slot("slot", slot, "pass a free slot's index")
        if not (isinstance(start, int) and 0 <= start <= self.slot_positions[slot]
                and start + t <= self.max_cache_len):
            raise GuardError(f"a prompt chunk of {t} tokens at {start!r} does not fit slot "
                             f"{slot}", where="prefill_slot", expected=f"0 <= start <= the "
                             f"slot's position ({self.slot_positions[slot]}), start + tokens <= "
                             f"{self.max_cache_len}", found=f"start {start!r}, {t} tokens",
                             fix="start a prompt at 0 and continue it where the last chunk "
                                 "ended, or re-export with a larger --max-cache-len")
        with self.lock:
            out = self.run_flat(self.generation.prefill, (input_ids, self._index(slot),
                                                          self._index(start)))
            self.slot_positions[slot] = start + t
            return out

    def decode_slots(self, input_ids: torch.Tensor, live=None) -> list:
        """One token for every slot, `input_ids` [N, 1] (a free slot's row is ignored): the
        flat outputs, logits [K, vocab] and their argmax [K, 1], K = N or, where the artifact
        has decode buckets, the smallest bucket holding every live slot (rows past K are
        not stepped). `live`: the slots in use, each must hold a prompt and have room for one
        more token (default: every slot)."""
        self._need_slots("decode_slots")
        live = range(self.slots) if live is None else set(live)
        with self.lock:
            for s in live:
                at = self.slot_positions[s]
                if not 0 < at < self.max_cache_len:
                    raise GuardError(f"slot {s} cannot take a token at position {at}",
                                     where="decode_slots", expected=f"0 < position < "
                                     f"{self.max_cache_len} (a prompt first, room left)",
                                     found=at, fix="prefill the slot first; finish a sequence "
                                                   "when its slot's cache is full")
            rows, entry = self._bucket(live)
            out = self.run_flat(entry, (input_ids[:rows] if rows < self.slots else input_ids,))
            # a live slot's next position (a full one takes no more); the plan keeps the
            # others it steps inside the cache
            self.slot_positions = [p + 1 if s in live else min(p + 1, self.max_cache_len - 1)
                                   if s < rows else p for s, p in enumerate(self.slot_positions)]
            return out

    def copy_slot(self, source: int, dest: int) -> None:
        """Slot `dest` takes slot `source`'s cache and position: a prompt prefilled once and
        continued by several sequences (aotc.serve's `n` choices). Every state tensor holds
        one row per slot (its first dimension); the whole row is copied, on the device."""
        self._need_slots("copy_slot")
        for name, value in (("source", source), ("dest", dest)):
            self._check_slot(name, value, "pass a slot's index")
        rowless = [n for n, t in self.state.items() if t.dim() == 0 or t.shape[0] != self.slots]
        if rowless:
            raise UsageError("a state tensor without a row per slot", where="copy_slot",
                             expected=f"first dimension {self.slots} (the slots)",
                             found=rowless[0], fix="prefill each slot instead")
        with self.lock:
            if source != dest:
                for t in self.state.values():
                    t[dest].copy_(t[source])
            self.slot_positions[dest] = self.slot_positions[source]

    def _check_slot(self, name: str, value, fix: str) -> None:
        """`value` (the argument `name`) is a slot's index: an int (not a bool) in range."""
        if not (isinstance(value, int) and not isinstance(value, bool)
                and 0 <= value < self.slots):
            raise UsageError(f"{name} {value!r} is not a slot of this generator", where=name,
                             expected=f"an int in 0..{self.slots - 1}", found=repr(value),
                             fix=fix)

    def _index(self, value: int) -> torch.Tensor:
        """The int64 tensor [value] on the device, made once (a copy to a GPU waits for the
        work queued before it; a server's prefills reuse these)."""
        cache = self.__dict__.setdefault("_indices", {})
        if value not in cache:
            cache[value] = torch.tensor([value], dtype=torch.int64, device=self.device)
        return cache[value]

    @contextlib.contextmanager
    def deferred_checks(self):
        """While held, CUDA graph replays of the slot entries fold their kernels' index flags
        into one flag per entry instead of reading them after each replay (a read waits for
        the device): yields `check()`, which reads them (call it where the host waits for the
        device anyway, once a step); replays read them every CHECK_EVERY themselves too, and
        at the end. No-op where nothing replays graphs."""
        names = [self.generation.prefill, self.generation.decode,
                 *(e for _, e in self.generation.buckets)]
        held = [(g, StickyFlag(self.device)) for n in names
                if (g := self.graphs.get(n)) is not None and g.folding is None]
        for g, flag in held:
            g.folding = flag

        def check():
            for g, flag in held:
                flag.check(g.entry.function)
        try:
            yield check
            check()
        finally:
            for g, flag in held:
                if g.folding is flag:      # (a generation in between may have reset it)
                    g.folding = None

    def _bucket(self, live) -> tuple[int, str]:
        """(K, entry): the smallest decode entry stepping every live slot, slots 0..K-1 (the
        manifest's buckets; the full decode steps all)."""
        top = max(live, default=0) + 1
        for rows, entry in self.generation.buckets:
            if rows >= top:
                return rows, entry
        return self.slots, self.generation.decode

    def _need_slots(self, call: str) -> None:
        if not self.slots:
            raise UsageError(f"{call} needs a generator with slots", where=call,
                             expected="an artifact exported with --max-batch N",
                             found="one batch in lockstep (no slots)",
                             fix="re-export with --decode --max-batch N, or use "
                                 "prefill/decode")


def unpadded_rows(input_ids: torch.Tensor, attention_mask) -> list[torch.Tensor]:
    """Each row's prompt [1, T_i] without its left padding (transformers' convention: the
    mask's zeros come first). Anything else is a UsageError."""
    if attention_mask is None:
        return [input_ids[i:i + 1] for i in range(input_ids.shape[0])]
    mask = torch.as_tensor(attention_mask).to(device=input_ids.device)
    if mask.shape != input_ids.shape:
        raise UsageError("the attention mask's shape differs from the prompt's",
                         where="attention_mask", expected=list(input_ids.shape),
                         found=list(mask.shape), fix="pass the tokenizer's attention_mask")
    keep = mask != 0
    first = keep.int().argmax(1)
    counts = keep.sum(1)
    left = (counts > 0) & (first + counts == keep.shape[1])
    if not bool(left.all()):
        raise UsageError("the prompts are not left-padded", where="attention_mask",
                         expected="each row's padding (0s) before its tokens (1s), at least "
                         "one token", found=mask[~left][:1].tolist(),
                         fix="tokenize with padding_side='left'")
    return [input_ids[i:i + 1, int(first[i]):] for i in range(input_ids.shape[0])]
