"""CUDA graphs: an entry's whole plan captured once per set of sizes and replayed with one
launch per call.

At small batch a GPU waits on the host: each kernel launch, extern call and allocation costs
microseconds of Python and driver time while the kernel itself runs for less. A plan does the
same work on every call with the same sizes, so it is captured into a CUDA graph and replayed:

- inputs are copied into static buffers the graph reads (any strides the caller passes);
- outputs are cloned out of the graph's buffers, so a result never changes under the caller
  when the next call replays the graph;
- Triton kernels that check indices write one error flag during the replay; it is read after
  the replay (one 4-byte read, only in plans that have such kernels), so out-of-range indices
  still raise; while a generation sets `folding` (a StickyFlag), replays fold their flags into
  it instead and it is read every CHECK_EVERY replays;
- before a graph is used, the call that captured it is checked against a plain run of the
  same inputs (and the artifact's recorded samples where their sizes match): any difference
  turns graphs off for this entry, with the reason kept in `reason`, and calls run the plain
  plan.

Graphs are keyed on the inputs' sizes (every size symbol is read from them, and grids, buffer
sizes and loop bounds are baked into a capture). A static entry has one key and captures on
its first call. An entry with dynamic dims captures a size on its second call with that size
(a size seen once, as in a sweep, does not pay for a capture) and keeps the `max_graphs` most
recently used graphs; the graphs of one entry share one memory pool (safe: nothing a replay
writes is read after the next replay, outputs being cloned at once), so their temporaries
take the memory of the largest, not the sum (each graph keeps its own inputs and outputs). Once as many graphs have been evicted as the cache holds, sizes
vary more than it can serve: new sizes then run the plain plan (the cached ones still replay),
and `full` says so.

Capture and replay take a lock, and replays share the graph's buffers, so calls on one entry
are serialised while they replay (CUDA graphs are for latency, not for concurrent callers);
calls that run the plain plan do not take it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from aotc.runtime.executor import step_bound

MAX_GRAPHS = 8      # graphs one dynamic entry keeps (aotc.load(cuda_graph_cache=))
_SEEN = 64          # sizes remembered as called once, waiting for a second call
CHECK_EVERY = 16    # replays between reads of a StickyFlag


class StickyFlag:
    """The index-check flags of many replays folded into one (the largest code), read every
    `CHECK_EVERY` replays and when asked: a generation's steps need no read of the device
    each. A kernel that flags an index skips the access, so the replays between a flag and its
    read touch no memory out of range; the read raises the plan's GuardError."""

    def __init__(self, device: torch.device):
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.pending = 0    # replays folded since the last read

    def fold(self, flag: torch.Tensor) -> None:
        torch.maximum(self.flag, flag, out=self.flag)

    def replayed(self, function, inputs) -> None:
        self.pending += 1
        if self.pending >= CHECK_EVERY:
            self.check(function, inputs)

    def check(self, function, inputs=None) -> None:
        """Raise the GuardError of an index flagged since the last read (`function`: the
        plan function whose kernels wrote the flags)."""
        if self.pending == 0:
            return
        self.pending = 0
        if int(self.flag.item()):
            bad = self.flag.clone()
            self.flag.zero_()
            function.check_flag(bad, inputs)

    def clear(self) -> None:
        """Drop what was folded and not read (a generation closed early)."""
        self.pending = 0
        self.flag.zero_()


@dataclass(slots=True)
class _Captured:
    """One graph: the buffers it reads and writes, and its error flags."""
    graph: object
    static_in: list
    static_out: tuple
    flags: list


class GraphedEntry:
    """Runs `entry.function` through CUDA graphs, one per set of input sizes."""

    def __init__(self, entry, device: torch.device, samples=None, *,
                 max_graphs: int = MAX_GRAPHS, state: list | None = None):
        """`samples`: a callable giving input sets (the artifact's recorded sample) that a
        capture at their sizes is also checked on; read only at capture, not at load.
        `state`: a generator's persistent tensors, which the plan updates: restored after each
        trial run of a capture, so the call that captures updates them once."""
        self.entry, self.device, self.samples = entry, device, samples
        self.state = state or []
        self.dynamic = bool(entry.spec.symbols)
        self.max_graphs = max(1, max_graphs) if self.dynamic else 1
        self.graphs: OrderedDict[tuple, _Captured] = OrderedDict()   # least recently used first
        self.seen: OrderedDict[tuple, None] = OrderedDict()
        self.evicted = 0
        self.reason: str | None = None     # why graphs are off for this entry, if they are
        self.full: str | None = None       # why new sizes are no longer captured, if they are not
        self.pool = None
        self.folding: StickyFlag | None = None   # set: replays fold their flags into it
        self.lock = threading.Lock()
        bound = sorted(step_bound(entry.plan))
        if bound:   # reading such a size waits for the GPU, which a capture cannot
            self.reason = (f"its sizes {', '.join(bound)} depend on tensor values "
                           "(read from results, which a CUDA graph cannot replay)")

    def status(self) -> str:
        """'graph' (some size replays one), 'pending' (none captured yet), or why graphs are
        off."""
        return self.reason or ("graph" if self.graphs else "pending")

    @property
    def sizes(self) -> list[tuple]:
        """The input sizes that replay a graph, least recently used first."""
        return [tuple(tuple(s) for s in key) for key in self.graphs]

    def __call__(self, args: tuple, symbols: dict) -> tuple:
        key = tuple(a.shape for a in args)
        with self.lock:
            g = self.graphs.get(key)
            if g is None and self.reason is None and self._wanted(key):
                g = self._capture(key, args, symbols)
            if g is not None:
                self.graphs.move_to_end(key)
                return self._replay(g, args)
        return self.entry.function(args, symbols)

    def _wanted(self, key: tuple) -> bool:
        """Whether to capture at `key` now: a static entry at once, a dynamic one on the
        second call with these sizes, unless the cache is `full`."""
        if not self.dynamic:
            return True
        if self.full is not None:
            return False
        if key in self.seen:
            del self.seen[key]
            return True
        self.seen[key] = None
        if len(self.seen) > _SEEN:
            self.seen.popitem(last=False)
        return False

    # -------------------------------------------------------------------------------- replay
    def _replay(self, g: _Captured, args: tuple) -> tuple:
        for dst, src in zip(g.static_in, args):
            dst.copy_(src)
        g.graph.replay()
        if self.folding is None:       # the index checks of the replay
            for flag in g.flags:
                self.entry.function.check_flag(flag, args)
        elif g.flags:                  # read later, with other replays' flags
            for flag in g.flags:
                self.folding.fold(flag)
            self.folding.replayed(self.entry.function, args)
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in g.static_out)

    # ------------------------------------------------------------------------------- capture
    def _capture(self, key: tuple, args: tuple, symbols: dict) -> _Captured | None:
        if len(self.graphs) >= self.max_graphs:
            self._evict()
        static_in = [torch.empty(a.shape, dtype=a.dtype, device=self.device).copy_(a)
                     for a in args]
        restore = self.snapshot()
        try:
            graph, out, flags = self._record(static_in, symbols, warmups=1 if self.dynamic else 2)
        except RuntimeError as e:   # something in the plan cannot be captured
            restore()
            self._disable(f"capture failed: {str(e).splitlines()[0]}")
            return None
        restore()
        g = _Captured(graph, static_in, out, flags)
        samples = [s for s in (self.samples() if self.samples else ())
                   if tuple(a.shape for a in s) == key]
        reason = self._mismatch(g, [args, *samples], symbols, restore)
        restore()
        if reason is not None:
            self._disable(reason)
            return None
        self.graphs[key] = g
        return g

    def snapshot(self):
        """A function that puts the state back as it is now (a capture's trial runs update
        it; the call that captures must update it once)."""
        held = [t.clone() for t in self.state]
        return lambda: [t.copy_(h) for t, h in zip(self.state, held)]

    def _record(self, static_in: list, symbols: dict, *, warmups: int) -> tuple:
        """(graph, its outputs, its error flags): the override point for tests without a GPU."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        return capture(self.entry.function, static_in, symbols, self.device, warmups=warmups,
                       pool=self.pool)

    def _evict(self) -> None:
        self.graphs.popitem(last=False)
        self.evicted += 1
        if self.evicted >= self.max_graphs:
            self.full = (f"{self.evicted} graphs evicted from a cache of {self.max_graphs}: "
                         "new sizes run without a graph")

    def _mismatch(self, g: _Captured, inputs: list, symbols: dict,
                  restore=lambda: None) -> str | None:
        """Why replays differ from plain runs of the same inputs (from the same state), or None
        if they do not."""
        for k, args in enumerate(inputs):
            with torch.no_grad():
                restore()
                want = self.entry.function(tuple(args), symbols)
                restore()
                got = self._replay(g, tuple(args))
            for i, (a, b) in enumerate(zip(got, want)):
                if isinstance(a, torch.Tensor) and not _same(a, b):
                    return f"graph replay differs from a plain run at output {i} of input set {k}"
        return None

    def _disable(self, reason: str) -> None:
        self.reason = reason
        self.graphs.clear()
        self.seen.clear()


def capture(fn, static_in: list, symbols: dict, device: torch.device, *, warmups: int,
            pool=None, error_mode: str = "global", then=None) -> tuple:
    """Capture plan function `fn` on `static_in` into a CUDA graph, after `warmups` plain runs
    on a side stream (lazy initialisation stays off the graph): (graph, its outputs, the error
    flags its kernels write during a replay, to be checked after it). `then(outputs, flags)`,
    if given, runs after the plan in the warm-ups and the capture (torch ops on its results,
    captured with it) and its return value is the graph's outputs. RuntimeError if something
    in the plan cannot be captured."""
    def run(flags: list):
        out = fn(tuple(static_in), symbols)
        return out if then is None else then(out, flags)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(warmups):
            held: list = []
            with fn.deferred_flags(held):
                run(held)
            for flag in held:
                fn.check_flag(flag, tuple(static_in), symbols)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    flags: list = []   # inside the capture a flag cannot be read: kept for after each replay
    with fn.deferred_flags(flags), torch.cuda.graph(graph, pool=pool,
                                                   capture_error_mode=error_mode), \
            torch.no_grad():
        out = run(flags)
    return graph, out, flags


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise the same values (NaNs in the same places count as equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)
