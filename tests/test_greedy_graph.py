"""The fused greedy step (runtime/greedy.py): decode, argmax and feedback in one CUDA graph.

Without a GPU the graphs are stand-ins that rerun what a capture would record (the plan, then
the fused step's argmax, feedback and flag folding) on every replay, so the generator's logic
is tested here: the tokens equal the plain path's, sessions keep their own fused step, a
capture that picks differently is not used, and an index a kernel flags during the fused
steps is still a GuardError. tests/test_cuda_graph.py and scripts/gpu_check.py run the real
graphs on a GPU."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.errors import GuardError
from aotc.runtime.graphs import CHECK_EVERY, GraphedEntry
from aotc.runtime.greedy import GreedyGraph
from conftest import llama_sample


class _HostGraph:
    """What a replay of the fused step does, on the CPU."""

    def __init__(self, fused, static_in, symbols, tamper=None):
        self.fused, self.static_in, self.symbols, self.tamper = fused, static_in, symbols, tamper
        self.replays = 0

    def replay(self):
        self.replays += 1
        if self.tamper is not None:
            self.tamper(self)
        fn, flags = self.fused.function, []
        with fn.deferred_flags(flags):
            out = fn(tuple(self.static_in), self.symbols)
        self.fused._then(out, flags)


class HostGreedy(GreedyGraph):
    def __init__(self, *args, tamper=None, **kw):
        super().__init__(*args, **kw)
        self.tamper, self.captures = tamper, 0

    def _record(self, static_in, symbols):
        self.captures += 1
        return _HostGraph(self, static_in, symbols, self.tamper), (static_in[0],), []


class HostDecode(GraphedEntry):
    def _record(self, static_in, symbols, *, warmups):
        fn = self.entry.function
        out = fn(tuple(static_in), symbols)
        graph = type("G", (), {"replay": lambda g: [d.copy_(s) for d, s in
                                                     zip(out, fn(tuple(static_in), symbols))]})
        return graph(), out, []


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    return aotc.export(llama_sample(), (ids,), tmp_path_factory.mktemp("fused") / "l.aotc",
                       decode=True, max_cache_len=96), ids


def _fused(path, **kw):
    """A loaded generator whose decode 'replays a graph' and whose greedy steps are fused."""
    m = aotc.load(path, runner="python")
    decode = m.generation.decode
    m.graphs = {decode: HostDecode(m.entries[decode], m.device, state=list(m.state.values()))}
    m.greedy = HostGreedy(m.graphs[decode], m.generation.token, **kw)
    return m


def test_fused_steps_generate_the_plain_tokens(artifact):
    path, ids = artifact
    want = aotc.load(path).generate(ids, 40)
    m = _fused(path)
    assert torch.equal(m.generate(ids, 40), want)
    assert m.greedy.status() == "graph" and m.greedy.captures == 1
    assert m.greedy.graph.replays == 40 - 2 + 1      # step 1 plain (captures decode), +1 check
    assert m.position == 9 + 39
    assert torch.equal(m.generate(ids, 40), want)     # again: the token is fed in afresh
    assert m.greedy.captures == 1
    streamed = list(m.stream(ids, 40))
    assert all(t.shape == (2, 1) for t in streamed)
    assert torch.equal(torch.cat([ids, *streamed], 1), want)
    assert len({t.data_ptr() for t in streamed}) == 40  # each step's tokens are the caller's


def test_fused_steps_feed_back_the_plans_own_token(artifact, monkeypatch):
    # format 18: the fused step copies the decode plan's argmax output into its input; an
    # artifact without one (format 17) has the graph take the argmax after the plan
    path, ids = artifact
    want = aotc.load(path).generate(ids, 12)
    m = _fused(path)
    assert m.greedy.index == m.generation.token == 1
    taken = []
    real = torch.Tensor.argmax
    monkeypatch.setattr(torch.Tensor, "argmax", lambda t, *a, **k: taken.append(1) or
                        real(t, *a, **k))
    assert torch.equal(m.generate(ids, 12), want) and not taken
    m = _fused(path)
    m.greedy.index = None
    assert torch.equal(m.generate(ids, 12), want) and taken


def test_sessions_fuse_their_own_steps(artifact):
    path, ids = artifact
    m = _fused(path)
    want = aotc.load(path).generate(ids, 24)
    other = m.session()
    assert other.greedy is None and m.greedy is not None
    assert torch.equal(m.generate(ids, 24), want)
    assert other.generate(ids[:, :5], 4).shape == (2, 9)


def test_eos_and_sampling_keep_their_semantics(artifact):
    path, ids = artifact
    plain, m = aotc.load(path), _fused(path)
    first = plain.generate(ids, 12)
    eos = int(first[0, 9 + 3])
    want = plain.generate(ids, 12, eos_token_id=eos)
    assert torch.equal(m.generate(ids, 12, eos_token_id=eos), want)
    g = lambda: torch.Generator().manual_seed(3)   # noqa: E731
    sampled = dict(do_sample=True, top_k=20)
    assert torch.equal(m.generate(ids, 12, generator=g(), **sampled),
                       plain.generate(ids, 12, generator=g(), **sampled))
    assert torch.equal(m.generate(ids, 12, repetition_penalty=1.3),
                       plain.generate(ids, 12, repetition_penalty=1.3))


def test_a_capture_that_picks_otherwise_is_not_used(artifact):
    path, ids = artifact

    def wrong(graph):   # the first replay is the capture's check: feed another token
        if graph.replays == 1:
            graph.static_in[0].add_(1)
    m = _fused(path, tamper=wrong)
    assert torch.equal(m.generate(ids, 20), aotc.load(path).generate(ids, 20))
    assert "other tokens than a plain step" in m.greedy.status()
    assert not m.greedy.usable()


def test_an_index_flagged_in_a_fused_step_is_a_guard_error(artifact):
    path, ids = artifact

    def bad(graph):     # a token past the vocabulary reaches the embedding at replay 5
        if graph.replays == 5:
            graph.static_in[0].fill_(10 ** 6)
    m = _fused(path, tamper=bad)
    with pytest.raises(GuardError, match="out of range|index"):
        m.generate(ids, 8)          # the flag is read when the generation ends
    m.reset()
    m.greedy.tamper = bad
    m.greedy.graph.tamper, m.greedy.graph.replays = bad, 0
    steps = m.stream(ids, 60)
    with pytest.raises(GuardError):
        for i, _ in enumerate(steps):
            assert i < 5 + CHECK_EVERY + 2   # read within CHECK_EVERY steps

    def flagged(graph):  # a kernel's flag, as a GPU replay leaves it (the CPU raises at once)
        if graph.replays == 5:
            graph.fused.sticky.flag.fill_(1)
    m.greedy.graph.tamper, m.greedy.graph.replays = flagged, 0
    steps = m.stream(ids, 12)
    for _ in range(8):                  # flagged at replay 5, closed before any read
        next(steps)
    steps.close()
    m.greedy.graph.tamper = None        # the next generation does not inherit the flag
    assert torch.equal(m.generate(ids, 12), aotc.load(path).generate(ids, 12))


class FlaggingDecode(HostDecode):
    """A decode 'graph' whose kernels flag an index at replay `at` (counting the capture's)."""
    at = 6

    def _record(self, static_in, symbols, *, warmups):
        graph, out, _ = super()._record(static_in, symbols, warmups=warmups)
        flag, plain, count = torch.zeros(1, dtype=torch.int32), graph.replay, [0]

        def replay():
            plain()
            count[0] += 1
            flag.fill_(7 if count[0] == self.at else 0)
        graph.replay = replay
        return graph, out, [flag]


@pytest.mark.parametrize("fold", [True, False])
def test_sampled_steps_read_their_index_flags_in_batches(artifact, fold):
    path, ids = artifact
    m = aotc.load(path, runner="python")
    decode = m.generation.decode
    m.graphs = {decode: FlaggingDecode(m.entries[decode], m.device,
                                       state=list(m.state.values()))}
    m.fold_flags = fold
    steps = m.stream(ids, 60, do_sample=True, top_k=20, generator=torch.Generator().manual_seed(0))
    seen = 0
    with pytest.raises(GuardError):
        for _ in steps:
            seen += 1
    # decode call k replays for the k+1-th time (the capture's check replays once): flagged in
    # the fifth; read after it (fold=False) or within CHECK_EVERY replays of it
    assert (5 < seen <= 5 + CHECK_EVERY) if fold else seen == 5
    assert m.graphs[decode].folding is None
    m.graphs[decode].at = -1
    m.reset()
    assert m.generate(ids, 20, do_sample=True, generator=torch.Generator().manual_seed(0)) \
        .shape == (2, 29)


# ------------------------------------------------------------------------------ on a GPU
def gpu(fn):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(),
                                              reason="needs a CUDA GPU")(fn))


@gpu
def test_fused_steps_on_a_gpu(tmp_path):
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1)).cuda()
    path = aotc.export(llama_sample().cuda(), (ids,), tmp_path / "l.aotc", decode=True,
                       max_cache_len=96, target="cuda")
    m = aotc.load(path)
    m.reset()
    logits = m.prefill(ids)
    plain = [logits.argmax(-1, keepdim=True)]
    for _ in range(39):
        plain.append(m.decode(plain[-1]).argmax(-1, keepdim=True))
    want = torch.cat([ids, *plain], 1)
    assert m.greedy is None                          # decode and argmax, not fused
    assert torch.equal(m.generate(ids, 40), want)
    assert m.greedy.status() == "graph"
    assert torch.equal(m.generate(ids, 40), want)
    session = m.session()
    assert torch.equal(session.generate(ids, 40), want) and session.greedy is not m.greedy
    g = lambda: torch.Generator("cuda").manual_seed(0)   # noqa: E731
    folded = m.generate(ids, 40, do_sample=True, top_k=50, generator=g())
    m.fold_flags = False
    assert torch.equal(m.generate(ids, 40, do_sample=True, top_k=50, generator=g()), folded)
    bad = m.greedy.token
    steps = m.stream(ids, 40)
    next(steps), next(steps), next(steps)           # fused steps under way
    bad.fill_(10 ** 6)                               # past the vocabulary: flagged
    with pytest.raises(GuardError):
        list(steps)
