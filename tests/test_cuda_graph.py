"""CUDA graphs (runtime/graphs.py): the load option and its refusals on any machine; capture
and replay where a GPU is present (scripts/gpu_check.py runs the same checks on the H200)."""
import pytest
import torch

import aotc
from aotc.api import compile_function
from aotc.runtime.graphs import _same

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
def test_dynamic_artifacts_refuse_insisted_graphs(tmp_path):
    from torch.export import Dim
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2
    p = aotc.export(Double(), (torch.randn(4, 8),), tmp_path / "d.aotc", target="cuda",
                    dynamic_shapes=({0: Dim("b", min=2, max=64)},))
    assert aotc.load(p).graph_status()["forward"] == "off"
    with pytest.raises(aotc.UsageError):
        aotc.load(p, cuda_graph=True)
