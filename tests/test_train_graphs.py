"""CUDA graphs of training artifacts (runtime/train_graphs.py).

The bookkeeping (when a forward may replay, which backward may read the graph's saved tensors,
recapture after parameters move, the checks at capture) runs on any machine: a stand-in graph
whose replay reruns the plan and writes the results into the same static buffers behaves as a
CUDA graph does, overwrite included. On a GPU the real thing is checked against plain runs
(scripts/gpu_check.py does the same for real models on the H200)."""
import copy

import pytest
import torch
from torch import nn

import aotc
from aotc.runtime.train_graphs import TrainingGraphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)
        self.norm = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.norm(self.a(x)))))


class _Replay:
    """A captured 'graph': replay reruns the plan on the static inputs into the static outputs."""

    def __init__(self, fn, static_in):
        self.fn, self.static_in = fn, static_in
        self.static_out, self.flags = fn(tuple(static_in), {}), []

    def replay(self):   # a graph writes memory behind autograd's back: no version bumps
        with torch.no_grad():
            for dst, src in zip(self.static_out, self.fn(tuple(self.static_in), {})):
                if dst is not None:
                    dst.data.copy_(src)


class HostGraphs(TrainingGraphs):
    def __init__(self, module, device, differ=False):
        super().__init__(module, device)
        self.differ, self.replayed = differ, 0

    def _get_rng(self):
        return torch.get_rng_state()

    def _set_rng(self, state):
        torch.set_rng_state(state)

    def _record(self, fn, static_in):
        g = _Replay(fn, static_in)
        outer = self

        class Counted:
            def replay(self):
                outer.replayed += 1
                g.replay()
                if outer.differ:
                    g.static_out[0].data.add_(1)
        return Counted(), g.static_out, g.flags


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(8, 16)
    return aotc.export(copy.deepcopy(model), (x,), tmp_path_factory.mktemp("tg") / "n.aotc",
                       train=True), model


def loaded(artifact, **kw):
    m = aotc.load(artifact[0], cuda_graph=False)
    m.graphs = HostGraphs(m, torch.device("cpu"), **kw)
    return m


def step(m, x, seed):
    torch.manual_seed(seed)
    loss = (m(x) * torch.linspace(-1, 1, 8, device=x.device)).sum()
    loss.backward()
    return loss


def grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def test_training_loop_matches_plain_runs_and_replays(artifact):
    g, plain = loaded(artifact), aotc.load(artifact[0], cuda_graph=False)
    assert g.graph_status() == {"forward": "pending", "backward": "pending"}
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (g, plain)]
    for k in range(4):
        x = torch.randn(8, 16)
        for m, opt in zip((g, plain), opts):
            opt.zero_grad()
            step(m, x, seed=k)
            opt.step()
        for n, p in g.named_parameters():
            torch.testing.assert_close(p, dict(plain.named_parameters())[n], rtol=0, atol=0)
    for (n, a), (_, b) in zip(g.named_buffers(), plain.named_buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)
    assert g.graph_status() == {"forward": "graph", "backward": "graph"}
    # per step one forward and one backward replay, plus the one each capture checks with
    assert g.graphs.replayed == 4 * 2 + 2


def test_outputs_are_the_callers(artifact):
    m = loaded(artifact)
    x1, x2 = torch.randn(8, 16), torch.randn(8, 16)
    with torch.no_grad():
        y1 = m(x1)
        keep = y1.clone()
        m(x2)
    assert torch.equal(y1, keep)


def test_two_forwards_before_one_backward(artifact):
    """The second forward must not overwrite what the first one's backward needs."""
    m, plain = loaded(artifact), aotc.load(artifact[0], cuda_graph=False)
    x1, x2 = torch.randn(8, 16), torch.randn(8, 16)
    for mod in (m, plain):
        torch.manual_seed(3)
        (mod(x1).sum() + (mod(x2) ** 2).sum()).backward()
    for n, a in grads(m).items():
        torch.testing.assert_close(a, grads(plain)[n], rtol=0, atol=0, msg=n)


def test_a_later_backward_over_overwritten_tensors_raises(artifact):
    m = loaded(artifact)
    x = torch.randn(8, 16)
    l1 = m(x).sum()
    l1.backward(retain_graph=True)
    m(x).sum().backward()          # replays forward over l1's saved tensors
    with pytest.raises(RuntimeError, match="overwritten by a later forward"):
        l1.backward()


def test_moved_parameters_are_captured_again(artifact):
    m, plain = loaded(artifact), aotc.load(artifact[0], cuda_graph=False)
    x = torch.randn(8, 16)
    step(m, x, 0)
    first = m.graphs.forward_graph
    with torch.no_grad():
        for mod in (m, plain):
            mod.get_parameter("a.weight").data = mod.get_parameter("a.weight").data * 0.5
    for mod in (m, plain):
        mod.zero_grad()
        step(mod, x, 1)
    assert m.graphs.forward_graph is not first
    for n, a in grads(m).items():
        torch.testing.assert_close(a, grads(plain)[n], rtol=0, atol=0, msg=n)


def test_a_replay_that_differs_turns_graphs_off(artifact):
    m, plain = loaded(artifact, differ=True), aotc.load(artifact[0], cuda_graph=False)
    x = torch.randn(8, 16)
    step(m, x, 0)
    step(plain, x, 0)
    status = m.graph_status()
    assert status["forward"].startswith("forward graph replay differs from a plain run")
    for n, a in grads(m).items():
        torch.testing.assert_close(a, grads(plain)[n], rtol=0, atol=0, msg=n)


def test_graphs_off_the_gpu(artifact):
    assert aotc.load(artifact[0]).graph_status() == {"forward": "off", "backward": "off"}
    with pytest.raises(aotc.UsageError):
        aotc.load(artifact[0], cuda_graph=True)


@cuda
def test_cuda_training_graphs_match_plain_runs(tmp_path):
    torch.manual_seed(0)
    model = Net().cuda()
    x = torch.randn(8, 16, device="cuda")
    p = aotc.export(model, (x,), tmp_path / "n.aotc", train=True, target="cuda")
    g, plain = aotc.load(p), aotc.load(p, cuda_graph=False)
    for k in range(3):
        for mod in (g, plain):
            mod.zero_grad()
            step(mod, x, k)
        for n, a in grads(g).items():
            torch.testing.assert_close(a, grads(plain)[n], msg=n)
    assert g.graph_status() == {"forward": "graph", "backward": "graph"}


@cuda
def test_cuda_index_errors_raise_a_few_calls_late_without_stalls(tmp_path):
    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.l = nn.Embedding(10, 8), nn.Linear(8, 4)

        def forward(self, i):
            return self.l(self.e(i))
    ids = torch.randint(0, 10, (4, 6), device="cuda")
    m = aotc.load(aotc.export(Emb().cuda(), (ids,), tmp_path / "e.aotc", train=True,
                              target="cuda"))
    m(ids).sum().backward()
    assert m.graph_status()["forward"] == "graph"
    bad = ids.clone()
    bad[0, 0] = 10
    with pytest.raises(aotc.GuardError, match="out of range"):
        for k in range(6):
            m(bad if k == 0 else ids).sum().backward()
            torch.cuda.synchronize()
    m(ids).sum().backward()   # still usable
