"""CUDA graphs for training artifacts: forward and backward each captured once and replayed.

A training step issues hundreds of kernels and vendor calls; at the batch sizes people train
with on one GPU the host takes longer to issue them than the GPU takes to run them (BERT-base
at batch 16 on an H200: about 9 ms of kernels behind 47 ms of host work). A training artifact
has static shapes, so its forward and its backward are captured into two CUDA graphs, sharing
one memory pool, and each call replays one of them. What is different from inference graphs
(runtime/graphs.py):

- **Saved tensors stay in the graph.** Forward's replay leaves what backward needs in the
  graph's static buffers, and the backward graph reads them there (no copy). The next forward
  replay overwrites them, so a forward replays only when no earlier forward still waits for its
  backward; otherwise (two forwards before one backward, an output kept alive for later) it
  runs the plain plan, whose saved tensors are its own. A backward whose saved tensors were
  overwritten (a second `backward(retain_graph=True)` after another forward) cannot happen
  silently: it raises.
- **Parameters are read in place.** Optimizers update parameters in place, so their addresses
  stay put; the addresses are compared on every call and a moved parameter (`p.data = ...`)
  makes both graphs be captured again.
- **Random ops draw from torch's generator as plain runs do**: the capture registers the
  generator, each replay takes the generator's current seed and offset and advances it by what
  the plain run would, so `torch.manual_seed` gives the same dropout masks with or without
  graphs. Capturing (its warm-up run) restores the generator state it found.
- **Checked before use**: the call that captures a graph also runs the plain plan on the same
  inputs (and generator state) and compares; a difference turns graphs off for the module, with
  the reason kept (`TrainableModule.graph_status()`). Results of nondeterministic vendor kernels
  (atomics in attention backward) are compared within the spread of two plain runs.
- Model outputs and gradients are copied out of the graph's buffers, so they never change under
  the caller; updated buffers (batch-norm statistics) are copied into the module's buffers
  right after the replay.
- **No host stalls**: Triton kernels that check indices write an error flag during a replay;
  it is copied to the host behind an event and read once the GPU is past it (`_Flags`), so an
  out-of-range index raises a call or a few late instead of every replay waiting for the GPU.

Calls are serialised (the graphs share buffers): a lock covers each forward and backward.
"""
from __future__ import annotations

import threading
import weakref

import torch

from aotc.runtime.graphs import _same, capture


class Token:
    """Held by one forward call's autograd context: which replay of which graph made the saved
    tensors it refers to."""
    __slots__ = ("graph", "replay", "backwarded", "__weakref__")

    def __init__(self, graph: "_Graph", replay: int):
        self.graph, self.replay, self.backwarded = graph, replay, False

    @property
    def intact(self) -> bool:
        """The graph has not replayed since: the saved tensors still hold this call's values."""
        return self.graph.replays == self.replay


class _Flags:
    """Index-error flags of a graph, read without stalling the host: after each replay they are
    copied into pinned host memory, one slot of a small ring, behind an event; a slot is checked
    once its event has completed (polled at every call) and at the latest when the ring comes
    round to it again. An out-of-range index thus raises a few calls late at most (as a CUDA
    device-side assert in eager PyTorch does, but with the process still usable); the plan's
    kernels mask the bad loads meanwhile."""
    RING = 4

    def __init__(self, flags: list, check):
        self.flags, self.check = flags, check
        self.host = [torch.zeros(len(flags), dtype=torch.int32, pin_memory=True)
                     for _ in range(self.RING)]
        self.events = [torch.cuda.Event() for _ in range(self.RING)]
        self.pending = [False] * self.RING
        self.next = 0

    def record(self) -> None:
        k = self.next
        self._check(k, wait=True)    # RING replays old: long done
        for i, flag in enumerate(self.flags):
            self.host[k][i:i + 1].copy_(flag, non_blocking=True)
        self.events[k].record()
        self.pending[k] = True
        self.next = (k + 1) % self.RING

    def poll(self) -> None:
        for k in range(self.RING):
            self._check(k, wait=False)

    def _check(self, k: int, wait: bool) -> None:
        if not self.pending[k] or not (wait or self.events[k].query()):
            return
        self.events[k].synchronize()
        self.pending[k] = False
        for i in range(len(self.flags)):
            try:
                self.check(self.host[k][i:i + 1])
            except Exception as e:
                e.add_note("aotc: found after a CUDA graph replay of an earlier training call "
                           "(index flags are read without stalling the GPU)")
                raise


class _Graph:
    """One captured entry: the graph, its static inputs and outputs, its index-error flags."""

    def __init__(self, graph, static_in: list, static_out: tuple, flags: list, check=None,
                 external: frozenset = frozenset()):
        """`external`: storages the graph does not own (parameters, buffers, static inputs)."""
        self.graph, self.static_in, self.static_out = graph, static_in, static_out
        self.flags = _Flags(flags, check) if flags else None
        self.replays = 0
        # outputs that are views of parameters or inputs (a transposed weight saved for
        # backward) are handed out detached at each replay: a view made at capture whose base
        # an optimizer has since updated in place cannot be saved for backward again
        self.views = [i for i, o in enumerate(static_out)
                      if isinstance(o, torch.Tensor) and o._is_view()
                      and o.untyped_storage().data_ptr() in external]

    def replay(self, args) -> tuple:
        for dst, src in zip(self.static_in, args):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        self.graph.replay()
        self.replays += 1
        if self.flags is not None:
            self.flags.record()
        if not self.views:
            return self.static_out
        out = list(self.static_out)
        for i in self.views:
            out[i] = out[i].detach()
        return tuple(out)

    def poll(self) -> None:
        if self.flags is not None:
            self.flags.poll()


class TrainingGraphs:
    """The graphs of one TrainableModule (its `forward` and `backward` entries)."""

    MAX_CAPTURES = 4   # parameters that keep moving are not worth capturing again and again

    def __init__(self, module, device: torch.device):
        self.module, self.device = module, device
        self.forward_graph: _Graph | None = None
        self.backward_graph: _Graph | None = None
        self.pending: weakref.ref | None = None    # the token of the last replayed forward
        self.pointers: tuple | None = None
        self.captures = 0
        self.pool = None
        self.reason: str | None = None
        self.lock = threading.Lock()

    # ---------------------------------------------------------------------------- status
    def status(self) -> dict[str, str]:
        if self.reason is not None:
            return {"forward": self.reason, "backward": self.reason}
        return {"forward": "graph" if self.forward_graph else "pending",
                "backward": "graph" if self.backward_graph else "pending"}

    def _pointers(self) -> tuple:
        m = self.module
        return tuple(t.data_ptr() for t in (*m.param_list, *m.buffer_list))

    def _off(self, reason: str) -> None:
        self.reason = reason
        self.forward_graph = self.backward_graph = None

    # ---------------------------------------------------------------------------- forward
    def forward(self, inputs: tuple) -> tuple[tuple, Token | None]:
        """Forward's flat outputs (model outputs, updated buffers, saved tensors) and, when a
        graph made them, the token the autograd context keeps."""
        plain = self.module.entries["forward"].function
        with self.lock:
            self._poll()
            if self.reason is None and self._usable():
                pending = self.pending() if self.pending is not None else None
                if not (pending is not None and not pending.backwarded and pending.intact
                        and pending.graph is self.forward_graph):
                    if self.forward_graph is None:
                        self._capture_forward(inputs)
                    if self.forward_graph is not None:
                        return self._replay_forward(inputs)
            return plain(inputs, {}), None

    def _usable(self) -> bool:
        """Whether the captured graphs still read the parameters where they are; if they do
        not, drop the graphs so that the next call captures them again."""
        pointers = self._pointers()
        if self.pointers is not None and pointers != self.pointers:
            self.forward_graph = self.backward_graph = None
            self.pending = None
            if self.captures >= self.MAX_CAPTURES:
                self._off(f"parameters moved {self.captures} times (p.data replaced); graphs off")
                return False
        self.pointers = pointers
        return True

    def _replay_forward(self, inputs: tuple) -> tuple:
        g = self.forward_graph
        out = g.replay(inputs)
        token = Token(g, g.replays)
        self.pending = weakref.ref(token)
        n = self.module.num_outputs
        # model outputs are the caller's; buffers are copied at once; saved tensors stay
        return tuple(o.clone() for o in out[:n]) + out[n:], token

    def _capture_forward(self, inputs: tuple) -> None:
        fn = self.module.entries["forward"].function
        rng = self._get_rng()
        static_in = [torch.empty_like(a).copy_(a) if isinstance(a, torch.Tensor) else a
                     for a in inputs]
        try:
            g = self._capture(fn, static_in)
            if g is None:
                return
            runs = []
            for _ in range(2):   # two plain runs from the same generator state, then the replay
                self._set_rng(rng)
                runs.append(fn(tuple(static_in), {}))
            self._set_rng(rng)
            reason = _compare(g.replay(static_in), *runs)
            if reason is not None:
                self._off(f"forward graph replay differs from a plain run ({reason}); graphs off")
                return
            self.forward_graph, self.captures = g, self.captures + 1
        finally:   # the call that captured runs from the generator state it was called with
            self._set_rng(rng)

    # --------------------------------------------------------------------------- backward
    def backward(self, token: Token | None, unpack, tangents: tuple) -> tuple:
        """Backward's flat outputs (gradients), copied out of the graph's buffers. `unpack()`
        gives a plain run's inputs (the saved tensors from the autograd context, then the
        tangents); a replay reads the saved tensors where the forward graph left them (the
        token says they are intact)."""
        plain = self.module.entries["backward"].function
        with self.lock:
            self._poll()
            self.check_intact(token)
            fwd = self.forward_graph
            if (token is not None and token.graph is fwd and fwd is not None
                    and self.reason is None and self._pointers() == self.pointers):
                token.backwarded = True
                saved = fwd.static_out[self.module.num_outputs + len(self.module.mutated_buffers):]
                if self.backward_graph is None:
                    self._capture_backward(saved, tangents)
                if self.backward_graph is not None:
                    return _copies(self.backward_graph.replay(saved + tangents))
                return plain(saved + tangents, {})
            if token is not None:
                token.backwarded = True
            return plain(unpack(), {})

    @staticmethod
    def check_intact(token: Token | None) -> None:
        """Raise if a later forward replay overwrote the tensors saved under `token` (called
        before autograd unpacks them)."""
        if token is not None and not token.intact:
            raise RuntimeError(
                "aotc: the tensors this backward needs were overwritten by a later forward "
                "replayed from a CUDA graph (backward ran twice with retain_graph=True around "
                "another forward); load the artifact with cuda_graph=False for this use")

    def _capture_backward(self, saved: tuple, tangents: tuple) -> None:
        fn = self.module.entries["backward"].function
        static_in = list(saved) + [torch.empty_like(t).copy_(t) for t in tangents]
        g = self._capture(fn, static_in)
        if g is None:
            return
        runs = [fn(tuple(static_in), {}) for _ in range(2)]
        reason = _compare(g.replay(static_in), *runs)
        if reason is not None:
            self._off(f"backward graph replay differs from a plain run ({reason}); graphs off")
            return
        self.backward_graph = g

    # ----------------------------------------------------------------------------- common
    def _get_rng(self):
        return torch.cuda.get_rng_state(self.device)

    def _set_rng(self, state) -> None:
        torch.cuda.set_rng_state(state, self.device)

    def _check(self, flag) -> None:
        self.module.entries["forward"].function.check_flag(flag)

    def _poll(self) -> None:
        """Raise for an out-of-range index an earlier replay met (runtime/train_graphs._Flags)."""
        for g in (self.forward_graph, self.backward_graph):
            if g is not None:
                g.poll()

    def _capture(self, fn, static_in: list) -> _Graph | None:
        """`fn` captured on `static_in` into the pool both graphs share, or None (and graphs
        off)."""
        try:
            graph, out, flags = self._record(fn, static_in)
        except RuntimeError as e:   # something in the plan cannot be captured
            self._off(f"capture failed: {str(e).splitlines()[0]}")
            return None
        m = self.module
        external = frozenset(t.untyped_storage().data_ptr()
                             for t in (*m.param_list, *m.buffer_list, *static_in)
                             if isinstance(t, torch.Tensor))
        return _Graph(graph, static_in, out, flags, self._check, external)

    def _record(self, fn, static_in: list) -> tuple:
        """(graph, its outputs, its error flags); thread_local: backward is captured on
        autograd's device thread."""
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        return capture(fn, static_in, {}, self.device, warmups=1, pool=self.pool,
                       error_mode="thread_local")


def _copies(out: tuple) -> tuple:
    """`out` with every tensor copied (one multi-tensor kernel, not one clone per gradient:
    x * 1 is exact, keeps -0.0 and NaN)."""
    at = [i for i, o in enumerate(out) if isinstance(o, torch.Tensor)]
    res = list(out)
    for i, copy in zip(at, torch._foreach_mul([out[i] for i in at], 1)):
        res[i] = copy
    return tuple(res)


def _tensors(a: tuple, b: tuple):
    return [(x, y) for x, y in zip(a, b) if isinstance(x, torch.Tensor)]


def _compare(got: tuple, want: tuple, again: tuple) -> str | None:
    """Why `got` (a replay) is not what a plain run gave (`want`), or None. Where a second plain
    run (`again`) differs from the first (nondeterministic kernels), the replay may differ from
    `want` by up to twice as much as the plain runs differ from each other."""
    for i, ((a, b), (_, c)) in enumerate(zip(_tensors(got, want), _tensors(got, again))):
        if _same(a, b):
            continue
        if _same(b, c) or a.shape != b.shape or a.dtype != b.dtype or not a.is_floating_point():
            return f"output {i}"
        allowed = (b.double() - c.double()).abs().max().item() * 2
        if (a.double() - b.double()).abs().max().item() > allowed:
            return f"output {i}, beyond the spread of two plain runs"
    return None
