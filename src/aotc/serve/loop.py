"""The engine's thread: one loop that steps the engine and hands each event to the request
that waits for it (serve stage).

The HTTP handlers run on an asyncio loop; the engine (serve/engine.py) runs on this thread
alone. `submit` registers a request's callback before the engine can step it, so no event is
lost. With `post` (the asyncio loop's `call_soon_threadsafe`), a step's events are handed to
that loop in one call and the callbacks run there, so a step of many requests wakes the loop
once, not once a token; without it the callbacks run on the engine's thread and must only
hand the event over. Idle, the thread sleeps until a request arrives.
`stop` ends the loop after the current step; requests still running are cancelled.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Callable

from aotc.serve.engine import Engine, Event, Request, SamplingParams


class EngineLoop:
    def __init__(self, engine: Engine, metrics=None, post=None):
        self.engine, self.metrics, self.post = engine, metrics, post
        self.watchers: dict[str, Callable[[Event], None]] = {}
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None     # what ended the loop, if not stop()
        self._ids = itertools.count()
        self.thread = threading.Thread(target=self._run, name="aotc-engine", daemon=True)

    def start(self) -> "EngineLoop":
        self.thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def submit(self, prompt: list[int], params: SamplingParams,
               on_event: Callable[[Event], None]) -> Request:
        """Queue a request whose events go to `on_event` (engine.add's errors propagate)."""
        return self.submit_choices(prompt, [params], [on_event])[0]

    def submit_choices(self, prompt: list[int], params: list,
                       on_events: list) -> list[Request]:
        """Queue n choices over one prompt (Engine.add_choices: one prefill), choice i's
        events to on_events[i]."""
        rids = [f"req-{next(self._ids)}" for _ in params]
        self.watchers.update(zip(rids, on_events))
        try:
            reqs = self.engine.add_choices(prompt, params, rids)
        except BaseException:
            for rid in rids:
                self.watchers.pop(rid, None)
            raise
        self.wake.set()
        return reqs

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)
        self.wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.wake.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def _run(self) -> None:
        try:
            with self.engine.running():
                self._steps()
        except BaseException as e:       # the engine failed: every waiting request must end
            self.error = e
        finally:
            self._abandon()

    def _steps(self) -> None:
        while not self.stopping.is_set():
            if not self.engine.has_work():
                self._gauges()
                self.wake.wait(0.5)
                self.wake.clear()
                continue
            t0 = time.perf_counter()
            events = self.engine.step()
            if events:
                self._dispatch(events)
            if self.metrics is not None:
                self.metrics.step(time.perf_counter() - t0, events)
            self._gauges()

    def _dispatch(self, events: list[Event]) -> None:
        if self.post is not None:
            try:
                self.post(self._deliver, events)
                return
            except RuntimeError:         # the consumer's loop is closed: deliver here
                pass
        self._deliver(events)

    def _deliver(self, events: list[Event]) -> None:
        for ev in events:
            watcher = self.watchers.get(ev.request.id)
            if ev.finish_reason is not None:
                self.watchers.pop(ev.request.id, None)
            if watcher is not None:
                watcher(ev)

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.gauges(self.engine.queued, self.engine.active)

    def _abandon(self) -> None:
        """The loop ends: every request still watched gets a final event."""
        events = self.engine.cancel_all()
        ended = {e.request.id for e in events}
        events += [Event(Request(rid, [], SamplingParams()), None, "cancelled")
                   for rid in list(self.watchers) if rid not in ended]
        self._dispatch(events)
