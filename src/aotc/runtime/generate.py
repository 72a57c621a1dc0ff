"""Generators at run time: a loaded artifact with prefill and decode entries and a KV cache.

The state (the caches and the position of the next token) lives on the module's device,
allocated with zeros at load; the entries' plans update it in place. The module keeps the
position on the host too, so a call that would write past the cache is a GuardError before
anything runs, and greedy generation needs no read of the device until it returns:

    m = aotc.load("llm.aotc")
    tokens = m.generate(input_ids, max_new_tokens=64)   # [batch, prompt + 64], greedy
    tokens = m.generate(input_ids, 64, do_sample=True, temperature=0.7, top_p=0.9)
    logits = m.prefill(input_ids); logits = m.decode(next_ids)   # one step at a time
    m.reset()                                             # an empty cache, position 0
    other = m.session()          # another stream's cache and position, the same weights
    steps = list(m.stream(input_ids, 64))   # each step's tokens [batch, 1] as made

On a GPU, decode (static shapes) replays one CUDA graph per step and prefill one per prompt
length it has seen twice (runtime/graphs.py); their captures leave the state as one call would.
Greedy `generate`/`stream` there replay one graph a token that also picks the token and feeds
it back (runtime/greedy.py).
With slots (`aotc export --max-batch N`, runtime/slots.py) the cache holds N sequences, each at
its own position: `generate`/`stream` run each row in its own slot, so a batch of prompts of
different lengths, left-padded with an `attention_mask` as transformers' tokenizers give it,
generates as each prompt would alone; `prefill_slot`/`decode_slots` serve many requests
(aotc.serve).
A module holds one sequence batch's state: calls that use it are serialised by a lock.
`m.session()` gives another over the same weights and kernels (its own caches, position, lock
and graphs), so independent streams run side by side, one thread each.
"""
from __future__ import annotations

import contextlib
import copy
import threading
import weakref

import torch

from aotc.errors import GuardError, UsageError
from aotc.runtime.graphs import StickyFlag
from aotc.runtime.greedy import GreedyGraph, greedy_token
from aotc.runtime.module import CompiledModule
from aotc.runtime.sampling import Choice
from aotc.runtime.slots import SlotMethods, unpadded_rows


class GenerativeModule(SlotMethods, CompiledModule):
    fold_flags = True    # plain decode steps of a generation read their index flags in batches

    def __init__(self, artifact, device, **kwargs):
        super().__init__(artifact, device, **kwargs)
        self.generation = self.manifest.generation
        self.position = 0
        self.slot_positions = [0] * (self.generation.slots or 0)
        self.lock = threading.RLock()
        self.family = weakref.WeakSet([self])     # the sessions over these weights
        self.greedy: GreedyGraph | None = None    # the fused greedy step, once greedy decodes

    def session(self) -> "GenerativeModule":
        """Another sequence batch's generator over the same loaded weights and kernels: its own
        caches (zeros) and position, plans bound to them, its own lock and CUDA graphs. A
        server serves several independent streams with one copy of the weights, each from its
        own thread; weight swaps (`load_state_dict`) reach every session."""
        other = copy.copy(self)
        other.state = {n: torch.zeros_like(t) for n, t in self.state.items()}
        other.entries = self.bound_entries(other.state)
        other.graphs = other._graphs(self.options["cuda_graph"], self.options["cuda_graph_cache"])
        other.position, other.lock, other.greedy = 0, threading.RLock(), None
        other.slot_positions = [0] * len(self.slot_positions)
        self.family.add(other)
        return other

    def load_state_dict(self, state_dict, strict: bool = True):
        """CompiledModule.load_state_dict for every session over these weights: it waits for
        each session's call in flight (a generate holds its session's lock throughout), then
        copies the weights in place and refreshes what each session's plans derived."""
        sessions = sorted(self.family, key=id)     # one lock order for every caller
        with contextlib.ExitStack() as held:
            for s in sessions:
                held.enter_context(s.lock)
            result = super().load_state_dict(state_dict, strict)
            for s in sessions:
                for e in s.entries.values() if s is not self else ():
                    e.function.refresh()
        return result

    @property
    def max_cache_len(self) -> int:
        return self.generation.max_cache_len

    def __call__(self, *args, **kwargs):
        raise UsageError("a generator has no forward: call generate, prefill or decode",
                         where="CompiledModule.__call__", expected="m.generate(input_ids, "
                         "max_new_tokens=N)", found="m(...)",
                         fix="use m.generate(...), or m.prefill(...) then m.decode(...)")

    def reset(self) -> None:
        """Empty the cache: every state tensor zeroed, position 0."""
        with self.lock:
            for t in self.state.values():
                t.zero_()
            self.position = 0
            self.slot_positions = [0] * len(self.slot_positions)

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run a prompt [batch, T] from position 0 (the cache is overwritten): logits of its
        last token [batch, vocab]; the position becomes T."""
        return self._prefill(input_ids)[0]

    def _prefill(self, input_ids: torch.Tensor) -> list:
        """prefill's flat outputs: the logits, then the greedy token where the plan has it."""
        if self.slots:
            self._need_lockstep("prefill")
        with self.lock:
            out = self.run_flat(self.generation.prefill, (input_ids,))
            self.position = input_ids.shape[1]
            return out

    def decode(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One token per sequence [batch, 1] at the current position: logits [batch, vocab]."""
        return self._decode(input_ids)[0]

    def _decode(self, input_ids: torch.Tensor) -> list:
        """decode's flat outputs: the logits, then the greedy token where the plan has it."""
        if self.slots:
            self._need_lockstep("decode")
        with self.lock:
            if self.position == 0:
                raise GuardError("decode before prefill: the cache holds no prompt",
                                 where="decode", expected="a prefill first",
                                 found="position 0", fix="call m.prefill(prompt) first")
            if self.position >= self.max_cache_len:
                raise GuardError(f"the cache is full: position {self.position}",
                                 where="decode", expected=f"position < max_cache_len "
                                 f"({self.max_cache_len})", found=self.position,
                                 fix="reset() and start again, or re-export with a larger "
                                     "--max-cache-len")
            out = self.run_flat(self.generation.decode, (input_ids,))
            self.position += 1
            return out

    def _need_lockstep(self, call: str) -> None:
        raise UsageError(f"{call} steps one batch in lockstep; this generator has slots",
                         where=call, expected="prefill_slot(ids, slot) and "
                         "decode_slots(tokens)", found=f"{self.slots} slots",
                         fix="call m.prefill_slot / m.decode_slots, or m.generate")

    def generate(self, input_ids, max_new_tokens: int,
                 eos_token_id: int | None = None, **sampling):
        """[batch, prompt + max_new_tokens] token ids (prompt first): greedy, or with
        `do_sample=True` drawn after `temperature`, `top_k`, `top_p` and `min_p` as
        transformers' sampling does (runtime/sampling.py; from `generator`, or torch's global
        random state); `repetition_penalty` applies to both. With `eos_token_id`, stops once
        every sequence has produced it (later tokens repeat it). `attention_mask` (artifacts
        with slots): prompts left-padded to one length, as transformers' generate takes
        them; each row runs in its own slot.
        A prompt (str) or a list of prompts gives text instead, through the tokenizer the
        artifact carries, stopped at its end-of-sequence ids (runtime/text.py)."""
        if isinstance(input_ids, (str, list, tuple)):
            from aotc.runtime.text import generate_text
            if eos_token_id is not None:
                raise UsageError("text generation stops at the tokenizer's eos ids",
                                 where="generate(text, eos_token_id=...)",
                                 expected="no eos_token_id", found=eos_token_id,
                                 fix="leave eos_token_id out (generation_config.json's ids "
                                     "are used)")
            return generate_text(self, input_ids, max_new_tokens, **sampling)
        steps = self.stream(input_ids, max_new_tokens, eos_token_id, **sampling)
        with self.lock:
            steps = list(steps)                    # the prompt's guards run first
            out = torch.cat([input_ids, *steps], dim=1)
        t = input_ids.shape[1]
        if out.shape[1] < t + max_new_tokens:
            pad = out[:, -1:].expand(-1, t + max_new_tokens - out.shape[1])
            out = torch.cat([out, pad], dim=1)
        return out

    def chat(self, messages: list[dict], max_new_tokens: int, **sampling) -> str:
        """The reply to a conversation ([{"role": ..., "content": ...}, ...]) rendered by the
        artifact's chat template, as text (runtime/text.py)."""
        from aotc.runtime.text import chat
        return chat(self, messages, max_new_tokens, **sampling)

    def stream(self, input_ids: torch.Tensor, max_new_tokens: int,
               eos_token_id: int | None = None, *, do_sample: bool = False,
               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               min_p: float = 0.0, repetition_penalty: float = 1.0,
               generator: torch.Generator | None = None, attention_mask=None):
        """`generate`, one step at a time: an iterator of each step's tokens [batch, 1] as
        they are made (a server's streamed reply), on the module's device. The arguments are
        checked now; the session's lock is held from the first step until the iterator ends
        or is closed. With `eos_token_id` it ends within 16 steps of every sequence having
        produced it (the steps between repeat it)."""
        pick = Choice(do_sample, temperature, top_k, top_p, min_p, repetition_penalty)
        # anything but a [batch, T] tensor is the prefill guards' to refuse, with their message
        t = input_ids.shape[1] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 \
            else 0
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1 \
                or t + max_new_tokens > self.max_cache_len:
            raise GuardError(f"{t} prompt tokens and {max_new_tokens} new ones do not fit the "
                             "cache", where="generate", expected=f"1 <= max_new_tokens and "
                             f"prompt + max_new_tokens <= {self.max_cache_len}",
                             found=t + max_new_tokens if isinstance(max_new_tokens, int)
                             else repr(max_new_tokens), fix="generate fewer tokens, or "
                             "re-export with a larger --max-cache-len")
        if generator is not None and generator.device.type != self.device.type:
            raise UsageError("the random generator is on another device than the module",
                             where="generator", expected=f"a torch.Generator on {self.device}",
                             found=str(generator.device),
                             fix=f"pass torch.Generator({str(self.device)!r}).manual_seed(...)")
        if self.slots:
            rows = unpadded_rows(input_ids, attention_mask)
            if len(rows) > self.slots:
                raise UsageError(f"a batch of {len(rows)} prompts exceeds the generator's "
                                 f"{self.slots} slots", where="generate", expected=f"at most "
                                 f"{self.slots} rows", found=len(rows),
                                 fix="split the batch, or re-export with a larger --max-batch")
            return self._slot_steps(input_ids, rows, max_new_tokens, eos_token_id, pick,
                                    generator)
        if attention_mask is not None and not bool(torch.as_tensor(attention_mask).all()):
            raise UsageError("padded prompts need a generator with slots", where="attention_mask",
                             expected="an artifact exported with --max-batch N (or prompts "
                             "of one length)", found="padding in the attention mask",
                             fix="re-export with --decode --max-batch N")
        return self._steps(input_ids, max_new_tokens, eos_token_id, pick, generator)

    def _slot_steps(self, input_ids, rows, max_new_tokens, eos_token_id, pick, generator):
        """stream over slots: row i's prompt (padding left out) in slot i, then every row
        decoded at once; the steps' tokens [batch, 1]."""
        b = len(rows)
        with self.lock:
            outs = [self.prefill_slot(r.to(self.device), i) for i, r in enumerate(rows)]
            outs = [torch.cat(o) for o in zip(*outs)]
            feed = torch.zeros(self.slots, 1, dtype=torch.int64, device=self.device)

            def decode(tokens):             # every slot steps; the batch's rows are read
                feed[:b] = tokens
                return [o[:b] for o in self.decode_slots(feed, live=range(b))]
            yield from self._loop(input_ids, outs, max_new_tokens, eos_token_id, pick,
                                  generator, None, decode)

    def _steps(self, input_ids, max_new_tokens, eos_token_id, pick, generator):
        with self.lock:
            outs = self._prefill(input_ids)
            fused = self._fused(pick)
            with self._folded_flags(fused) as folded:
                yield from self._loop(input_ids, outs, max_new_tokens, eos_token_id, pick,
                                      generator, fused)
                if folded is not None:
                    folded.check(self.entries[self.generation.decode].function)
            if fused is not None:
                fused.check()

    def _loop(self, input_ids, outs, max_new_tokens, eos_token_id, pick, generator, fused,
              decode=None):
        """The tokens of each step, after the prefill's flat outputs `outs`; `decode(tokens)`:
        the next step's flat outputs (default: the decode entry's)."""
        # a tensor-parallel artifact's ranks sample rank 0's draw (their own could differ)
        shared = pick.sample and self.manifest.tensor_parallel is not None
        done, history = None, input_ids.to(self.device) if pick.wants_history else None
        picked, fed = None, False   # the fused step's token; whether it holds the input
        for i in range(max_new_tokens):
            nxt = picked if picked is not None else self._pick(outs, pick, generator, history)
            if shared:
                torch.distributed.broadcast(nxt, src=0)
            if done is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
            yield nxt
            if history is not None:
                history = torch.cat([history, nxt], 1)
            if eos_token_id is not None:
                done = nxt == eos_token_id if done is None else done | (nxt == eos_token_id)
                if i % 16 == 15 and bool(done.all()):   # a read of the device, now and then
                    return
            if i + 1 < max_new_tokens:
                picked = self._fused_step(fused, None if fed else nxt)
                fed = picked is not None
                outs = (decode or self._decode)(nxt) if picked is None else None

    def _pick(self, outs: list, pick, generator, history) -> torch.Tensor:
        """The next tokens [batch, 1] from a step's flat outputs: the plan's greedy token where
        it has one and the choice is a plain argmax, else `pick` of the logits."""
        if not pick.sample and not pick.wants_history:
            return greedy_token(outs, self.generation.token)
        return pick(outs[0], generator, history)

    @contextlib.contextmanager
    def _folded_flags(self, fused):
        """While a generation's plain decode steps replay a graph (sampling, a repetition
        penalty): their index flags folded and read every CHECK_EVERY steps and at the end
        (runtime/graphs.py StickyFlag), not after each step, so the host runs ahead of the
        device. `fold_flags = False` reads them after each step."""
        graphed = self.graphs.get(self.generation.decode)
        if graphed is None or fused is not None or not self.fold_flags:
            yield None
            return
        graphed.folding = StickyFlag(self.device)
        try:
            yield graphed.folding
        finally:
            graphed.folding = None

    def _fused(self, pick) -> GreedyGraph | None:
        """The session's fused greedy step (runtime/greedy.py), where its picks are greedy ones
        and decode replays a CUDA graph."""
        graphed = self.graphs.get(self.generation.decode)
        if pick.sample or pick.wants_history or graphed is None:
            return None
        if self.greedy is None:
            self.greedy = GreedyGraph(graphed, self.generation.token)
        self.greedy.begin()
        return self.greedy

    def _fused_step(self, fused: GreedyGraph | None, token) -> torch.Tensor | None:
        """The next token from one replay of the fused step, or None where it cannot run (the
        caller runs a plain decode step). The stream checked that the cache has room."""
        if fused is None or not fused.usable():
            return None
        entry = self.entries[self.generation.decode]
        symbols = entry.guards.bind((token,)) if fused.graph is None else None
        picked = fused.step(token, symbols)
        if picked is not None:
            self.position += 1
        return picked

    def signature(self, entry: str | None = None) -> str:
        return super().signature(entry or self.generation.prefill)

    @property
    def inputs(self) -> list:
        return list(self.entries[self.generation.prefill].spec.inputs)

    def random_inputs(self, entry: str | None = None, **kwargs) -> tuple:
        return super().random_inputs(entry or self.generation.prefill, **kwargs)

