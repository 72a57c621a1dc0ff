"""Recurrent layers (nn.LSTM, nn.GRU, nn.RNN) export as their time steps unrolled: matmuls and
pointwise steps. On the CPU torch decomposes an inference LSTM into mkldnn_rnn_layer calls
(a CPU-only op no runner calls) unless mkldnn is off, and its GRU and RNN decompositions leave
an in-place transpose_ on a view, which export makes functional."""
import pytest
import torch
from torch import nn

import aotc
from aotc.exporter.decomp import _functional

aten = torch.ops.aten


class Recurrent(nn.Module):
    def __init__(self, kind: str, **kwargs):
        super().__init__()
        self.rnn = getattr(nn, kind)(16, 24, **kwargs)

    def forward(self, x, *state):
        out, last = self.rnn(x, *state)
        return out, last


CASES = {
    "lstm": ("LSTM", dict(num_layers=2, batch_first=True, bidirectional=True)),
    "lstm_proj": ("LSTM", dict(num_layers=1, batch_first=True, proj_size=8)),
    "gru": ("GRU", dict(num_layers=2, batch_first=True, bidirectional=True)),
    "gru_seq_first": ("GRU", dict(num_layers=1)),
    "rnn_relu": ("RNN", dict(num_layers=2, nonlinearity="relu", batch_first=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrent_layers_match_eager(case, tmp_path):
    kind, kwargs = CASES[case]
    torch.manual_seed(0)
    model = Recurrent(kind, **kwargs).eval()
    x = torch.randn(3, 5, 16)
    path = aotc.export(model, (x,), tmp_path / "m.aotc")
    m = aotc.load(path)
    fresh = torch.randn(3, 5, 16)
    with torch.no_grad():
        want = model(fresh)
    got = m(fresh)
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_an_initial_state_is_an_input(tmp_path):
    torch.manual_seed(0)
    model = Recurrent("GRU", num_layers=2, batch_first=True).eval()
    x, h = torch.randn(2, 4, 16), torch.randn(2, 2, 24)
    m = aotc.load(aotc.export(model, (x, h), tmp_path / "m.aotc"))
    h2 = torch.randn(2, 2, 24)
    with torch.no_grad():
        want = model(x, h2)
    for g, w in zip(m(x, h2), want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_in_place_ops_map_to_their_functional_overloads():
    assert _functional(aten.add_.Tensor) is aten.add.Tensor
    assert _functional(aten.transpose_.default) is aten.transpose.int   # other overload name
    assert _functional(aten.t_.default) is aten.t.default
    assert _functional(aten.add.Tensor) is None
