"""CUDA graphs: an entry's whole plan captured once and replayed with one launch per call.

At small batch a GPU waits on the host: each kernel launch, extern call and allocation costs
microseconds of Python and driver time while the kernel itself runs for less. A static plan
(no symbolic sizes) does the same work on every call, so it is captured into a CUDA graph on
its first call and replayed afterwards:

- inputs are copied into static buffers the graph reads (any strides the caller passes);
- outputs are cloned out of the graph's buffers, so a result never changes under the caller
  when the next call replays the graph;
- Triton kernels that check indices write one error flag during the replay; it is read after
  the replay (one 4-byte read, only in plans that have such kernels), so out-of-range indices
  still raise;
- before the graph is used, the call that captured it is checked against a plain run of the
  same inputs (and the artifact's recorded samples): any difference disables the graph for
  this entry, with the reason kept in `reason`, and calls run the plain plan.

Capture takes a lock, and replays share the graph's buffers, so calls on one entry are
serialised while a graph is in use (CUDA graphs are for latency, not for concurrent callers).
"""
from __future__ import annotations

import threading

import torch


class GraphedEntry:
    """Runs `entry.function` through a CUDA graph captured on the first call."""

    def __init__(self, entry, device: torch.device, samples=None):
        """`samples`: a callable giving input sets (the artifact's recorded sample) that the
        capture is also checked on; read only when the graph is captured, not at load."""
        self.entry, self.device, self.samples = entry, device, samples
        self.graph = None
        self.static_in: list = []
        self.static_out: tuple = ()
        self.flags: list = []
        self.reason: str | None = None     # why graphs are off for this entry, if they are
        self.lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.reason is None

    def __call__(self, args: tuple, symbols: dict) -> tuple:
        with self.lock:
            if self.graph is None and self.reason is None:
                self._capture(args, symbols)
            if self.graph is None:
                return self.entry.function(args, symbols)
            return self._replay(args)

    # -------------------------------------------------------------------------------- replay
    def _replay(self, args: tuple) -> tuple:
        for dst, src in zip(self.static_in, args):
            dst.copy_(src)
        self.graph.replay()
        for flag in self.flags:   # index checks made during the replay
            self.entry.function.namespace["check_error_flag"](flag)
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in self.static_out)

    # ------------------------------------------------------------------------------- capture
    def _capture(self, args: tuple, symbols: dict) -> None:
        fn = self.entry.function
        self.static_in = [torch.empty(a.shape, dtype=a.dtype, device=self.device).copy_(a)
                          for a in args]
        try:
            graph, out, flags = capture(fn, self.static_in, symbols, self.device, warmups=2)
        except RuntimeError as e:   # something in the plan cannot be captured
            self._disable(f"capture failed: {str(e).splitlines()[0]}")
            return
        self.graph, self.static_out, self.flags = graph, out, flags
        reason = self._mismatch([args, *(self.samples() if self.samples else ())], symbols)
        if reason is not None:
            self.graph = None
            self._disable(reason)

    def _mismatch(self, inputs: list, symbols: dict) -> str | None:
        """Why replays differ from plain runs of the same inputs, or None if they do not."""
        for k, args in enumerate(inputs):
            with torch.no_grad():
                want = self.entry.function(tuple(args), symbols)
                got = self._replay(tuple(args))
            for i, (a, b) in enumerate(zip(got, want)):
                if isinstance(a, torch.Tensor) and not _same(a, b):
                    return f"graph replay differs from a plain run at output {i} of input set {k}"
        return None

    def _disable(self, reason: str) -> None:
        self.reason = reason
        self.static_in, self.static_out, self.flags = [], (), []


def capture(fn, static_in: list, symbols: dict, device: torch.device, *, warmups: int,
            pool=None, error_mode: str = "global") -> tuple:
    """Capture plan function `fn` on `static_in` into a CUDA graph, after `warmups` plain runs
    on a side stream (lazy initialisation stays off the graph): (graph, its outputs, the error
    flags its kernels write during a replay, to be checked after it). RuntimeError if
    something in the plan cannot be captured."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(warmups):
            fn(tuple(static_in), symbols)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    check = fn.namespace.get("check_error_flag")
    flags: list = []
    if check is not None:   # inside the capture a flag cannot be read: keep it for later
        fn.namespace["check_error_flag"] = flags.append
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode=error_mode), torch.no_grad():
            out = fn(tuple(static_in), symbols)
    finally:
        if check is not None:
            fn.namespace["check_error_flag"] = check
    return graph, out, flags


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise the same values (NaNs in the same places count as equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)
