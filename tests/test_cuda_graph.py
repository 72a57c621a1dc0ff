"""CUDA graphs (runtime/graphs.py): the load option and its refusals on any machine; capture
and replay where a GPU is present (scripts/gpu_check.py runs the same checks on the H200)."""
import pytest
import torch

import aotc
from aotc.api import compile_function
from aotc.runtime.graphs import GraphedEntry, _same

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def softmax_cpu(tmp_path_factory):
    return compile_function(lambda x: torch.softmax(x * 3, -1), (torch.randn(8, 16),),
                            tmp_path_factory.mktemp("g") / "soft.aotc")


def test_cpu_artifacts_run_without_graphs(softmax_cpu):
    m = aotc.load(softmax_cpu)
    assert m.graph_status() == {"forward": "off"}
    x = torch.randn(8, 16)
    torch.testing.assert_close(m(x), torch.softmax(x * 3, -1))


def test_insisting_on_graphs_off_a_gpu_says_why(softmax_cpu):
    with pytest.raises(aotc.UsageError) as e:
        aotc.load(softmax_cpu, cuda_graph=True)
    assert e.value.expected == "device='cuda'" and e.value.found == "cpu"
    assert aotc.load(softmax_cpu, cuda_graph=False).graph_status() == {"forward": "off"}


def test_replays_are_checked_bitwise_with_nans_in_place():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert _same(a, a.clone())
    assert not _same(a, torch.tensor([1.0, 2.0, 3.0]))
    assert not _same(a, a.double())
    assert _same(torch.arange(3), torch.arange(3)) and not _same(torch.arange(3), torch.ones(3))


@cuda
def test_capture_replay_and_owned_outputs(tmp_path):
    x = torch.randn(64, 256)
    p = compile_function(lambda x: torch.softmax(x * 3, -1), (x,), tmp_path / "s.aotc",
                         target="cuda")
    m, xs = aotc.load(p), x.cuda()
    assert m.graph_status()["forward"] == "pending"
    y1 = m(xs)
    assert m.graph_status()["forward"] == "graph"
    x2 = torch.randn_like(xs)
    torch.testing.assert_close(m(x2), torch.softmax(x2 * 3, -1))
    torch.testing.assert_close(y1, torch.softmax(xs * 3, -1))


@cuda
def test_dynamic_artifacts_replay_a_graph_per_size(tmp_path):
    from torch.export import Dim
    p = aotc.export(Softmax(), (torch.randn(4, 8),), tmp_path / "d.aotc", target="cuda",
                    dynamic_shapes=({0: Dim("b", min=2, max=64)},))
    m = aotc.load(p, cuda_graph=True)
    for b in (3, 3, 5, 3, 5):
        x = torch.randn(b, 8, device="cuda")
        torch.testing.assert_close(m(x), torch.softmax(x * 2, -1))
    assert m.graph_status()["forward"] == "graph"
    assert sorted(m.graphs["forward"].sizes) == [((3, 8),), ((5, 8),)]


# ------------------------------------------------ the graph cache, with a stand-in for the GPU
class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2, -1)


class _HostGraph:
    """A captured 'graph' on the CPU: replay reruns the plan on the static inputs and writes
    the results into the same static outputs, as a CUDA graph overwrites its buffers."""

    def __init__(self, fn, static_in, symbols):
        self.fn, self.static_in, self.symbols = fn, static_in, symbols
        self.static_out = fn(tuple(static_in), symbols)

    def replay(self):
        for dst, src in zip(self.static_out, self.fn(tuple(self.static_in), self.symbols)):
            dst.copy_(src)


class HostGraphed(GraphedEntry):
    def __init__(self, *args, differ=False, **kw):
        super().__init__(*args, **kw)
        self.differ, self.captures = differ, 0

    def _record(self, static_in, symbols, *, warmups):
        self.captures += 1
        g = _HostGraph(self.entry.function, static_in, symbols)
        if self.differ:
            g.static_out[0].add_(1)
            replay = g.replay
            g.replay = lambda: (replay(), g.static_out[0].add_(1))
        return g, g.static_out, []


@pytest.fixture(scope="module")
def dynamic_cpu(tmp_path_factory):
    from torch.export import Dim
    return aotc.export(Softmax(), (torch.randn(4, 8),), tmp_path_factory.mktemp("d") / "d.aotc",
                       dynamic_shapes=({0: Dim("b", min=2, max=64)},))


def graphed(path, **kw):
    m = aotc.load(path, runner="python")   # graphs wrap a plan function (here the Python runner)
    samples = lambda: [m.recorded_samples()[0]]   # noqa: E731
    m.graphs = {"forward": HostGraphed(m.entries["forward"], m.device, samples, **kw)}
    return m, m.graphs["forward"]


def call(m, b):
    x = torch.randn(b, 8)
    y = m(x)
    torch.testing.assert_close(y, torch.softmax(x * 2, -1))
    return y


def test_dynamic_entry_captures_a_size_on_its_second_call(dynamic_cpu):
    m, g = graphed(dynamic_cpu)
    call(m, 3)
    assert (g.captures, m.graph_status()["forward"]) == (0, "pending")   # a size seen once
    y = call(m, 3)
    assert (g.captures, m.graph_status()["forward"], g.sizes) == (1, "graph", [((3, 8),)])
    y_before = y.clone()
    call(m, 3)
    call(m, 5)
    assert g.captures == 1                   # replayed, and 5 seen once only
    assert torch.equal(y, y_before)          # outputs are the caller's: the replay cloned them


def test_graph_cache_keeps_the_most_recent_sizes_then_stops_capturing(dynamic_cpu):
    m, g = graphed(dynamic_cpu, max_graphs=2)
    for b in (2, 2, 3, 3, 2, 4, 4):
        call(m, b)
    assert g.sizes == [((2, 8),), ((4, 8),)] and g.evicted == 1 and g.full is None
    for b in (5, 5, 6, 6, 7, 7):
        call(m, b)
    assert g.evicted == 2 and g.full and "new sizes run without a graph" in g.full
    assert g.sizes == [((4, 8),), ((5, 8),)] and g.captures == 4   # 6, 7 were not captured
    call(m, 4)
    assert g.captures == 4 and g.sizes[-1] == ((4, 8),) and m.graph_status()["forward"] == "graph"


def test_a_replay_that_differs_turns_graphs_off_for_the_entry(dynamic_cpu):
    m, g = graphed(dynamic_cpu, differ=True)
    for b in (3, 3, 3, 4, 4):
        call(m, b)                           # plain runs: results stay right
    assert g.captures == 1 and not g.graphs
    assert m.graph_status()["forward"].startswith("graph replay differs from a plain run")


def test_capture_at_the_recorded_sizes_checks_the_recorded_sample(dynamic_cpu):
    m, g = graphed(dynamic_cpu)
    checked = []
    mismatch = g._mismatch
    g._mismatch = lambda cap, inputs, symbols, *rest: checked.append(len(inputs)) or mismatch(
        cap, inputs, symbols, *rest)
    call(m, 3), call(m, 3), call(m, 4), call(m, 4)   # the sample was recorded at batch 4
    assert checked == [1, 2]


def test_dynamic_artifacts_run_without_guard_checks(dynamic_cpu):
    m = aotc.load(dynamic_cpu, check_guards=False)   # sizes are still bound from the inputs
    call(m, 7)
