"""Greedy decoding on a GPU: the decode plan, the argmax of its logits and the feedback of that
token into the next step's input, captured as one CUDA graph.

`generate` and `stream` without sampling or a repetition penalty pick each token with an
argmax of the decode step's logits (the plan's own argmax kernel where the artifact has one,
manifest generation.token) and feed it to the next step. Done between graph replays, that is
an argmax, a copy into the graph's input, a clone of the logits and a read of the plan's error
flag: a host round trip and more launches a token. Here one replay does it all, and the host
only clones the token out (the tokens it yields are its own):

- the graph's input buffer is its own: each replay reads the token the previous one wrote;
- index checks still hold: the kernels that check indices write their flags during the replay
  and the graph folds them into one sticky flag (runtime/graphs.py StickyFlag), read every
  `CHECK_EVERY` steps and when the generation ends, so an out-of-range index is still a
  GuardError (a kernel that flags an index skips the access, so the steps in between touch no
  memory out of range);
- it is captured once per session, after the decode entry's own graph was captured and checked
  against a plain run (runtime/graphs.py), and checked itself: its first replay must pick the
  token a plain decode step and argmax pick from the same state, or it is not used
  (`status` says why) and the steps go the plain way.
"""
from __future__ import annotations

import torch

from aotc.runtime.graphs import StickyFlag, capture


def greedy_token(outputs, index: int | None) -> torch.Tensor:
    """The greedy token [batch, 1] of a generator step's flat outputs: output `index`, the
    plan's own argmax (format 18, manifest generation.token), or the argmax of the logits."""
    if index is not None:
        return outputs[index]
    return outputs[0].argmax(-1, keepdim=True)


class GreedyGraph:
    """One session's fused greedy step over its decode entry (a GraphedEntry)."""

    def __init__(self, graphed, token: int | None = None):
        self.graphed, self.device = graphed, graphed.device   # its state: graphed.state
        self.function = graphed.entry.function
        self.index = token      # the plan's output holding the greedy token (None: argmax)
        self.graph = None
        self.token: torch.Tensor | None = None     # the graph's input: the token it reads
        self.sticky: StickyFlag | None = None      # every replay's index flags, folded
        self.reason: str | None = None             # why it is not used, if it is not

    def status(self) -> str:
        return self.reason or ("graph" if self.graph is not None else "pending")

    def usable(self) -> bool:
        """Whether steps can replay it now (capturing it first if need be)."""
        return self.reason is None and self.graphed.status() == "graph"

    def begin(self) -> None:
        """A generation starts: flags of one that ended unread (a stream closed early) are
        dropped; its kernels touched no memory out of range."""
        if self.sticky is not None:
            self.sticky.clear()

    def step(self, token: torch.Tensor | None, symbols) -> torch.Tensor | None:
        """The next token [batch, 1] after feeding `token` (None: the one the last replay
        picked), or None if the fused graph cannot be used (run the plain step instead)."""
        if self.graph is None and not self._capture(token, symbols):
            return None
        if token is not None:
            self.token.copy_(token)
        self.graph.replay()
        self.sticky.replayed(self.function, (self.token,))
        return self.token.clone()

    def check(self) -> None:
        """Raise the GuardError of an index a kernel flagged since the last check."""
        if self.sticky is not None:
            self.sticky.check(self.function, (self.token,))

    # ------------------------------------------------------------------------------ capture
    def _capture(self, token, symbols) -> bool:
        self.token = token.clone()
        self.sticky = StickyFlag(self.device)
        restore = self.graphed.snapshot()
        try:
            self.graph, _, _ = self._record([self.token], symbols)
        except RuntimeError as e:
            restore()
            return self._off(f"capture failed: {str(e).splitlines()[0]}")
        except BaseException:   # a flagged index in a trial run: the state as it was
            restore()
            raise
        restore()
        with torch.no_grad():
            want = greedy_token(self.function((token,), symbols), self.index).clone()
        restore()
        self.token.copy_(token)
        self.graph.replay()
        restore()
        self.sticky.clear()
        if not torch.equal(self.token, want):
            return self._off("the fused greedy step picks other tokens than a plain step")
        return True

    def _record(self, static_in: list, symbols) -> tuple:
        """(graph, outputs, flags) of the fused step: the override point for tests without a
        GPU."""
        if self.graphed.pool is None:
            self.graphed.pool = torch.cuda.graph_pool_handle()
        return capture(self.function, static_in, symbols, self.device, warmups=2,
                       pool=self.graphed.pool, then=self._then)

    def _then(self, outputs: tuple, flags: list) -> tuple:
        """After the plan, inside the graph: the argmax fed back, the flags folded."""
        self.token.copy_(greedy_token(outputs, self.index))
        for flag in flags:
            self.sticky.fold(flag)
        return (self.token,)

    def _off(self, reason: str) -> bool:
        self.reason, self.graph = reason, None
        return False
