"""Continuous batching over a generator's cache slots (serve stage; runtime only).

In: a loaded generator with slots (`aotc export --decode --max-batch N`, runtime/slots.py) and
requests (prompt token ids and their sampling). Out: each request's tokens, step by step.

    engine = Engine(aotc.load("llm.aotc"))
    r = engine.add([1, 2, 3], SamplingParams(max_tokens=32, temperature=0))
    while engine.has_work():
        for event in engine.step():          # (request, token or None, finish reason or None)
            ...
    r.tokens, r.finish_reason                # "stop", "length" or "cancelled"

A step moves waiting requests into free slots, decodes one token for every running request
at once (one decode over the slots, each at its own position), and prefills at most
`prefill_chunk` prompt tokens, the next chunks of the prompts not in their slots yet, first
come first: a long prompt, or many arriving at once, is prefilled over several steps between
decodes instead of holding every running request up (a prompt's first token comes from its
last chunk). Where the module replays CUDA graphs, chunks are powers of two, so a handful of
prefill graphs serve every prompt length. The step's next tokens, for the decoded requests
and the finished prompts together, are chosen on the device in one batch (serve/sampler.py:
greedy, or temperature, top-k and top-p per request) and written into the next decode's
input there; the host reads them back once a step. A request leaves when it produces a stop
token ("stop": the stop token is not one of its tokens), has `max_tokens` tokens ("length"),
or is cancelled; its slot is free for the next step. A request's tokens do not depend on the
others running beside it: each slot's computation reads its own cache and position only, and
a sampled request draws from its own random numbers (seeded by `seed`, or by the system's
entropy).

One thread steps the engine; `add` and `cancel` may be called from others (a lock guards the
queue). The engine holds the module's lock while it steps.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections import deque
from dataclasses import dataclass, field

import torch

from aotc.errors import AotcError, UsageError
from aotc.runtime.greedy import greedy_token
from aotc.runtime.sampling import Choice
from aotc.serve.sampler import Draws, choose

FINISH_REASONS = ("stop", "length", "cancelled")


class QueueFull(AotcError):
    """The engine's waiting queue is full: try again later (a server answers 429)."""


@dataclass(frozen=True)
class SamplingParams:
    """One request's choice of tokens: greedy where `temperature` is 0, else drawn after
    temperature, top-k and top-p (runtime/sampling.py, as transformers does)."""
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        ok = lambda v, lo: isinstance(v, int) and not isinstance(v, bool) and v >= lo  # noqa
        if not ok(self.max_tokens, 1):
            raise UsageError("max_tokens must be a positive int", where="max_tokens",
                             expected="an int >= 1", found=repr(self.max_tokens),
                             fix="ask for at least one token")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0 <= self.temperature <= 100:
            raise UsageError("temperature is out of range", where="temperature",
                             expected="a number in [0, 100] (0: greedy)",
                             found=repr(self.temperature), fix="pass a temperature in range")
        if self.seed is not None and not ok(self.seed, 0):
            raise UsageError("seed must be an int >= 0", where="seed", expected="an int >= 0",
                             found=repr(self.seed), fix="pass a non-negative seed")
        if not all(ok(t, 0) for t in self.stop_token_ids):
            raise UsageError("stop token ids must be ints >= 0", where="stop_token_ids",
                             expected="a list of token ids", found=repr(self.stop_token_ids),
                             fix="pass token ids")
        self.choice()        # top_k, top_p: Choice's checks and messages

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def choice(self) -> Choice:
        if self.greedy:
            return Choice(sample=True, top_k=self.top_k, top_p=self.top_p)  # checks only
        return Choice(sample=True, temperature=float(self.temperature), top_k=self.top_k,
                      top_p=float(self.top_p))


@dataclass(eq=False)
class Request:
    """A request's prompt, sampling and progress (the engine's thread updates it)."""
    id: str
    prompt: list[int]
    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    slot: int | None = None
    prefilled: int = 0                  # prompt tokens in the slot's cache so far
    pending: int | None = None          # the last token, fed to the next decode
    draws: Draws | None = None          # a sampled request's random numbers
    source: "Request | None" = None     # the choice whose prefilled slot this one copies

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class Event:
    """What a step did to a request: a new token, and/or its end."""
    request: Request
    token: int | None
    finish_reason: str | None


class Engine:
    def __init__(self, module, prefill_chunk: int = 64, max_waiting: int = 1024,
                 max_active: int | None = None):
        if not getattr(module, "slots", 0):
            raise UsageError("the engine needs a generator with slots", where="Engine",
                             expected="an artifact exported with --decode --max-batch N",
                             found=type(module).__name__,
                             fix="re-export the model with --decode --max-batch N")
        if not (isinstance(prefill_chunk, int) and prefill_chunk >= 1):
            raise UsageError("prefill_chunk must be an int >= 1", where="prefill_chunk",
                             expected="an int >= 1", found=repr(prefill_chunk),
                             fix="pass a chunk size such as 64")
        if max_active is not None and not (isinstance(max_active, int)
                                           and 1 <= max_active <= module.slots):
            raise UsageError(f"max_active {max_active!r} is not a number of slots",
                             where="max_active", expected=f"1..{module.slots} (the artifact's "
                             "--max-batch)", found=repr(max_active),
                             fix=f"pass at most {module.slots}, or re-export with a larger "
                                 "--max-batch")
        self.module, self.prefill_chunk, self.max_waiting = module, prefill_chunk, max_waiting
        self.max_active = max_active or module.slots
        self.slots: list[Request | None] = [None] * module.slots
        self.waiting: deque[Request] = deque()
        self.prefilling: deque[Request] = deque()     # in slots, prompts not all in the cache
        self.feed = torch.zeros(module.slots, 1, dtype=torch.int64, device=module.device)
        self._index_cache: dict[tuple, torch.Tensor] = {}
        self.pow2 = bool(getattr(module, "graphs", None))
        self.check = lambda: None      # reads deferred index flags (running())
        self.cancelled: set[str] = set()
        self.lock = threading.Lock()
        self._ids = itertools.count()
        self.vocab = module.generation.vocab

    # ------------------------------------------------------------------------ other threads
    def add(self, prompt, params: SamplingParams | None = None,
            request_id: str | None = None) -> Request:
        """Queue a request (checked now: a UsageError says what is wrong with it; QueueFull
        when `max_waiting` requests wait already)."""
        return self.add_choices(prompt, [params or SamplingParams()], [request_id])[0]

    def add_choices(self, prompt, params: list, request_ids: list | None = None) -> list:
        """Queue several requests over one prompt (`n` choices), all or none: the first's
        prompt is prefilled, and each other that holds a slot by the end of that prefill
        takes a copy of its slot (module.copy_slot) instead of prefilling the prompt again;
        each draws its own tokens from there (one that finds no slot by then prefills the
        prompt itself)."""
        if not params:
            raise UsageError("no choices to add", where="params", expected="at least one "
                             "SamplingParams", found="[]", fix="pass one per choice")
        checked = [self._checked_prompt(prompt, p) for p in params]
        ids = request_ids or [None] * len(params)
        reqs = [Request(rid if rid is not None else f"req-{next(self._ids)}", checked[0], p)
                for rid, p in zip(ids, params)]
        for r in reqs[1:]:
            r.source = reqs[0]
        with self.lock:
            if len(self.waiting) + len(reqs) > self.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests wait already", where="queue",
                                expected=f"at most {self.max_waiting} waiting",
                                found=len(self.waiting) + len(reqs), fix="retry after a while")
            self.waiting.extend(reqs)
        return reqs

    def cancel(self, request_id: str) -> None:
        """End a request at the next step (finish reason "cancelled"), freeing its slot."""
        with self.lock:
            self.cancelled.add(request_id)

    def cancel_all(self) -> list[Event]:
        """End every request now (on the engine's thread: serving stops); their events."""
        with self.lock:
            self.cancelled |= {r.id for r in self.waiting}
            self.cancelled |= {r.id for r in self.slots if r is not None}
        return self._cancel()

    def _checked_prompt(self, prompt, params: SamplingParams) -> list[int]:
        cache = self.module.max_cache_len
        if not isinstance(prompt, (list, tuple)) or not prompt or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab
                for t in prompt):
            raise UsageError("the prompt must be a non-empty list of token ids", where="prompt",
                             expected=f"ints in [0, {self.vocab})",
                             found=repr(prompt)[:80], fix="tokenize the prompt first")
        if len(prompt) + params.max_tokens > cache:
            raise UsageError(f"{len(prompt)} prompt tokens and max_tokens {params.max_tokens} "
                             f"exceed the cache of {cache} positions", where="prompt",
                             expected=f"prompt + max_tokens <= {cache}",
                             found=len(prompt) + params.max_tokens,
                             fix="shorten the prompt or ask for fewer tokens")
        return list(prompt)

    # ------------------------------------------------------------------------ engine thread
    @contextlib.contextmanager
    def running(self):
        """While the engine's thread steps it: CUDA graph replays read their index flags once
        a step, after the step's tokens are read back (GenerativeModule.deferred_checks)."""
        with self.module.deferred_checks() as check:
            self.check = check
            try:
                yield self
            finally:
                self.check = lambda: None

    def has_work(self) -> bool:
        with self.lock:
            return bool(self.waiting) or any(r is not None for r in self.slots)

    @property
    def active(self) -> int:
        """Slots in use."""
        return sum(r is not None for r in self.slots)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    def step(self) -> list[Event]:
        """Cancel what was cancelled, move waiting requests into free slots, decode every
        running request, and prefill at most `prefill_chunk` prompt tokens (the next chunks of
        the prompts not in their slots yet, first come first). The step's tokens are chosen
        on the device at once and read back with one transfer. Returns what happened, in
        order."""
        events = self._cancel()
        with self.module.lock:
            self._admit()
            groups = self._decode() + self._prefill()
            if not groups:
                return events
            reqs = [r for rs, _, _ in groups for r in rs]
            logits, greedy = ((torch.cat(x) if len(x) > 1 else x[0]) for x in
                              ([g[1] for g in groups], [g[2] for g in groups]))
            tokens = choose(logits, greedy, [(r.params, r.draws) for r in reqs])
            self.feed.index_copy_(0, self._indices(tuple(r.slot for r in reqs)), tokens)
            ids = tokens.view(-1).tolist()          # the step's one wait for the device
            self.check()
        return events + [self._take(r, t) for r, t in zip(reqs, ids)]

    def _cancel(self) -> list[Event]:
        with self.lock:
            gone, self.cancelled = self.cancelled, set()
            kept = deque(r for r in self.waiting if r.id not in gone)
            dropped = [r for r in self.waiting if r.id in gone]
            self.waiting = kept
        dropped += [r for r in self.slots if r is not None and r.id in gone]
        return [self._finish(r, "cancelled") for r in dropped]

    def _admit(self) -> None:
        with self.lock:
            for s, held in enumerate(self.slots):
                if held is None and self.waiting and self.active < self.max_active:
                    r = self.waiting.popleft()
                    r.slot = s
                    r.draws = None if r.params.greedy else Draws(
                        r.params.seed if r.params.seed is not None
                        else int.from_bytes(os.urandom(8), "little"))
                    self.slots[s] = r
                    self.prefilling.append(r)

    def _prefill(self) -> list[tuple]:
        """The next prompt chunks, `prefill_chunk` tokens at most in all; ([request], logits
        [1, vocab], greedy token [1, 1]) of each prompt whose last chunk this was, and of the
        choices that copy its slot (add_choices), in the same step."""
        budget, done = self.prefill_chunk, []
        for r in list(self.prefilling):
            if r not in self.prefilling:
                continue          # a copy of a slot prefilled earlier in this loop
            if r.finished:
                self.prefilling.remove(r)
                continue
            if r.source is not None and r.source in self.prefilling:
                continue          # its prompt is on its way into the source's slot
            if not budget:
                break
            n = self._chunk(len(r.prompt) - r.prefilled, budget)
            chunk = torch.tensor([r.prompt[r.prefilled:r.prefilled + n]], dtype=torch.int64)
            outs = self.module.prefill_slot(chunk.to(self.module.device, non_blocking=True),
                                            r.slot, r.prefilled)
            r.prefilled, budget = r.prefilled + n, budget - n
            if r.prefilled == len(r.prompt):
                self.prefilling.remove(r)
                got = (outs[0], greedy_token(outs, self.module.generation.token))
                done.append(([r], *got))
                done += [([c], *got) for c in self._copies(r)]
        return done

    def _copies(self, r: Request) -> list[Request]:
        """The choices waiting in slots for r's prompt, given a copy of r's slot."""
        copies = [c for c in self.prefilling if c.source is r and not c.finished]
        for c in copies:
            self.module.copy_slot(r.slot, c.slot)
            c.prefilled = len(c.prompt)
            self.prefilling.remove(c)
        return copies

    def _chunk(self, remaining: int, budget: int) -> int:
        """A prefill call's length: as much as the budget allows; where the module replays
        CUDA graphs, a power of two (a graph per length: a handful, captured early)."""
        n = min(remaining, budget)
        return 1 << (n.bit_length() - 1) if self.pow2 else n

    def _decode(self) -> list[tuple]:
        """One decode step over the running requests: [(requests in slot order, their logits
        [R, vocab], their greedy tokens [R, 1])], or [] where none runs."""
        live = [r for r in self.slots if r is not None and r.pending is not None]
        if not live:
            return []
        slots = tuple(r.slot for r in live)
        outs = self.module.decode_slots(self.feed, live=slots)
        greedy = greedy_token(outs, self.module.generation.token)
        logits = outs[0]
        if slots != tuple(range(logits.shape[0])):
            rows = self._indices(slots)
            logits, greedy = logits.index_select(0, rows), greedy.index_select(0, rows)
        return [(live, logits, greedy)]

    def _indices(self, slots: tuple) -> torch.Tensor:
        """The slots as an int64 tensor on the device (kept: a few sets recur)."""
        t = self._index_cache.get(slots)
        if t is None:
            if len(self._index_cache) > 4096:
                self._index_cache.clear()
            t = self._index_cache[slots] = torch.tensor(slots, dtype=torch.int64,
                                                        device=self.module.device)
        return t

    def _take(self, r: Request, token: int) -> Event:
        """Request r's new token: kept, or its end."""
        if token in r.params.stop_token_ids:
            return self._finish(r, "stop")
        r.tokens.append(token)
        if len(r.tokens) >= r.params.max_tokens:
            return self._finish(r, "length", token)
        r.pending = token
        return Event(r, token, None)

    def _finish(self, r: Request, reason: str, token: int | None = None) -> Event:
        r.finish_reason, r.pending = reason, None
        if r.slot is not None and self.slots[r.slot] is r:
            self.slots[r.slot] = None
        return Event(r, token, reason)
