"""Continuous batching over a generator's cache slots (serve stage; runtime only).

In: a loaded generator with slots (`aotc export --decode --max-batch N`, runtime/slots.py) and
requests (prompt token ids and their sampling). Out: each request's tokens, step by step.

    engine = Engine(aotc.load("llm.aotc"))
    r = engine.add([1, 2, 3], SamplingParams(max_tokens=32, temperature=0))
    while engine.has_work():
        for event in engine.step():          # (request, token or None, finish reason or None)
            ...
    r.tokens, r.finish_reason                # "stop", "length" or "cancelled"

A step decodes one token for every running request at once (one decode over all slots, each
at its own position), then moves waiting requests into free slots: a prompt is written into
its slot by prefill, in chunks of `prefill_chunk` tokens, one chunk a step, so a long prompt
does not hold the other slots up (its first token comes from its last chunk). A request
leaves when it produces a stop token ("stop": the stop token is not one of its tokens), has
`max_tokens` tokens ("length"), or is cancelled; its slot is free for the next step. A
request's tokens do not depend on the others running beside it: each slot's computation reads
its own cache and position only, and each request samples from its own random generator
(seeded by `seed`, or by the system's entropy).

One thread steps the engine; `add` and `cancel` may be called from others (a lock guards the
queue). The engine holds the module's lock while it steps.
"""
from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from dataclasses import dataclass, field

import torch

from aotc.errors import AotcError, UsageError
from aotc.runtime.greedy import greedy_token
from aotc.runtime.sampling import Choice

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
    generator: torch.Generator | None = None

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
    def __init__(self, module, prefill_chunk: int = 256, max_waiting: int = 1024,
                 max_active: int | None = None):
        if not getattr(module, "slots", 0):
            raise UsageError("the engine needs a generator with slots", where="Engine",
                             expected="an artifact exported with --decode --max-batch N",
                             found=type(module).__name__,
                             fix="re-export the model with --decode --max-batch N")
        if not (isinstance(prefill_chunk, int) and prefill_chunk >= 1):
            raise UsageError("prefill_chunk must be an int >= 1", where="prefill_chunk",
                             expected="an int >= 1", found=repr(prefill_chunk),
                             fix="pass a chunk size such as 256")
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
        self.cancelled: set[str] = set()
        self.lock = threading.Lock()
        self._ids = itertools.count()
        self.vocab = module.generation.vocab

    # ------------------------------------------------------------------------ other threads
    def add(self, prompt, params: SamplingParams | None = None,
            request_id: str | None = None) -> Request:
        """Queue a request (checked now: a UsageError says what is wrong with it; QueueFull
        when `max_waiting` requests wait already)."""
        params = params or SamplingParams()
        prompt = self._checked_prompt(prompt, params)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        r = Request(rid, prompt, params)
        with self.lock:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests wait already", where="queue",
                                expected=f"at most {self.max_waiting} waiting",
                                found=len(self.waiting) + 1, fix="retry after a while")
            self.waiting.append(r)
        return r

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
        """Cancel what was cancelled, decode every running request, and prefill the next chunk
        of each request in a slot whose prompt is not in its cache yet, after moving waiting
        requests into free slots. Returns what happened, in order."""
        events = self._cancel()
        with self.module.lock:
            events += self._decode()
            self._admit()
            events += self._prefill()
        return events

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
                    r.generator = self._generator(r.params)
                    self.slots[s] = r

    def _generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        return torch.Generator(self.module.device).manual_seed(seed)

    def _prefill(self) -> list[Event]:
        events = []
        for r in [r for r in self.slots if r is not None and r.prefilled < len(r.prompt)]:
            chunk = r.prompt[r.prefilled:r.prefilled + self.prefill_chunk]
            ids = torch.tensor([chunk], dtype=torch.int64, device=self.module.device)
            outs = self.module.prefill_slot(ids, r.slot, r.prefilled)
            r.prefilled += len(chunk)
            if r.prefilled == len(r.prompt):
                events.append(self._take(r, self._choose(r, outs, 0)))
        return events

    def _decode(self) -> list[Event]:
        live = [r for r in self.slots if r is not None and r.pending is not None]
        if not live:
            return []
        feed = torch.zeros(len(self.slots), 1, dtype=torch.int64)
        for r in live:
            feed[r.slot, 0] = r.pending
        outs = self.module.decode_slots(feed.to(self.module.device),
                                        live=[r.slot for r in live])
        greedy = greedy_token(outs, self.module.generation.token).view(-1).tolist() \
            if any(r.params.greedy for r in live) else None
        return [self._take(r, greedy[r.slot] if r.params.greedy else
                           self._choose(r, outs, r.slot)) for r in live]

    def _choose(self, r: Request, outs: list, row: int) -> int:
        """Request r's next token from a step's flat outputs (its row of them)."""
        if r.params.greedy:
            return int(greedy_token(outs, self.module.generation.token).view(-1)[row])
        logits = outs[0][row:row + 1]
        return int(r.params.choice()(logits, r.generator))

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
