"""Transposed matmul weights on the CPU (codegen/layouts.py): a linear layer's weight is stored
as its [K, N] transpose where the CPU BLAS runs `mm` faster with it ("NN" instead of "NT"):
every matmul reading it has at most 32 rows, or the weight has at most 2**20 elements. The plan
slot keeps the logical shape; outputs match eager; weights with other readers, tied weights,
training artifacts and CUDA artifacts keep PyTorch's layout."""
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.export import Dim

import aotc
from aotc.codegen.layouts import SMALL_M, SMALL_WEIGHT


def _export(model, inputs, path, **kw):
    model.eval()
    p = aotc.export(model, inputs, path, **kw)
    manifest = json.loads((p / "manifest.json").read_text())
    return p, manifest["weights"].get("transposed", [])


class Wide(nn.Module):
    """One linear layer whose weight (1025 x 1024) is just over the small-weight bound."""
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1024, 1025)

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_the_bounds_are_the_documented_ones():
    assert SMALL_M == 32 and SMALL_WEIGHT == 2 ** 20 and 1025 * 1024 > SMALL_WEIGHT


def test_transformer_weights_stored_transposed_and_match_eager(tmp_path):
    from aotc.exporter.loader import load_model
    model = load_model("samples/transformer.py:Net")
    x = torch.randn(1, 64, 128)
    path, transposed = _export(model, (x,), tmp_path / "t.aotc")
    linear = sorted(n for n, p in model.named_parameters() if p.dim() == 2)
    assert sorted(transposed) == linear and len(linear) == 8
    stored = load_file(path / "weights.safetensors")
    state = model.state_dict()
    for name in linear:   # the file holds W^T: [K, N]
        assert stored[name].shape == state[name].t().shape
        torch.testing.assert_close(stored[name], state[name].t(), rtol=0, atol=0)
    plan = json.loads((path / "plans/forward.json").read_text())
    slots = [s for s in plan["slots"] if s.get("layout") == "transposed"]
    assert len(slots) == 8 and all(s["stride"] == [1, s["shape"][0]] for s in slots)
    m = aotc.load(path)
    with torch.no_grad():
        x = torch.randn(1, 64, 128)
        want, got = model(x), m(x)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, chosen", [(8, True), (SMALL_M, True), (64, False)])
def test_large_weights_only_for_few_rows(tmp_path, rows, chosen):
    model = Wide()
    x = torch.randn(rows, 1024)
    path, transposed = _export(model, (x,), tmp_path / "w.aotc")
    assert (transposed == ["fc.weight"]) == chosen
    with torch.no_grad():
        torch.testing.assert_close(aotc.load(path)(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("top, chosen", [(16, True), (64, False)])
def test_dynamic_rows_are_judged_at_the_declared_maximum(tmp_path, top, chosen):
    model = Wide()
    path, transposed = _export(model, (torch.randn(4, 1024),), tmp_path / "d.aotc",
                               dynamic_shapes=({0: Dim("batch", min=1, max=top)},))
    assert (transposed == ["fc.weight"]) == chosen
    m = aotc.load(path)
    with torch.no_grad():
        for rows in (1, 3, top):
            x = torch.randn(rows, 1024)
            torch.testing.assert_close(m(x), model(x), rtol=1e-5, atol=1e-5)


class OtherReaders(nn.Module):
    """fc's weight is also read by a reduction; head's is tied to emb's (an embedding)."""
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.emb = nn.Embedding(10, 16)
        self.head = nn.Linear(16, 10, bias=False)
        self.head.weight = self.emb.weight
        self.out = nn.Linear(16, 16)

    def forward(self, ids):
        h = self.emb(ids)
        h = self.fc(h) * self.fc.weight.sum()
        return self.head(h), self.out(h)


def test_weights_with_other_readers_or_ties_keep_their_layout(tmp_path):
    model = OtherReaders()
    ids = torch.randint(0, 10, (2, 5))
    path, transposed = _export(model, (ids,), tmp_path / "o.aotc")
    assert transposed == ["out.weight"]
    with torch.no_grad():
        for got, want in zip(aotc.load(path)(ids), model(ids), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_and_cuda_artifacts_keep_pytorch_layout(tmp_path):
    from aotc.exporter.loader import load_model
    model = load_model("samples/mlp.py:Net")
    x = torch.randn(4, 64)
    model.train()
    path = aotc.export(model, (x,), tmp_path / "train.aotc", train=True)
    assert json.loads((path / "manifest.json").read_text())["weights"]["transposed"] == []
    pytest.importorskip("triton")
    path, transposed = _export(model, (x,), tmp_path / "gpu.aotc", target="cuda:sm_90")
    assert transposed == []


def test_inspect_names_the_transposed_weights(tmp_path):
    path, transposed = _export(Wide(), (torch.randn(2, 1024),), tmp_path / "i.aotc")
    from aotc.cli.report import inspect_text
    text = inspect_text(path)
    assert "stored transposed" in text and "fc.weight" in text
