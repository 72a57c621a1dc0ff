"""Load-time folding (runtime/folding.py): what reads only fixed values runs once, at load, in
both runners, and stays right after weights are swapped; what varies (inputs, sizes, state,
random draws) runs on every call."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.runtime import folding
from conftest import assert_matches, eager

RUNNERS = ["python", "cpp"]


class WeightNormed(torch.nn.Module):
    """wav2vec2's positional convolution: its weight is g * v / |v|, computed per call."""

    def __init__(self):
        super().__init__()
        conv = torch.nn.Conv1d(8, 8, 5, padding=2, groups=2)
        self.conv = torch.nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.out(torch.nn.functional.gelu(self.conv(x)).transpose(1, 2))


class Dft(torch.nn.Module):
    """A matrix built from index arithmetic alone (FNet's DFT), times the input."""

    def forward(self, x):
        n = torch.arange(x.shape[-1], dtype=torch.float32)
        basis = torch.cos(n[:, None] * n[None, :] * (2 * torch.pi / 16))
        return x @ basis


class ConstantOut(torch.nn.Module):
    """An output computed from weights alone."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w, torch.tanh(self.w) * 2


def _code(path) -> str:
    return aotc.load(path, runner="python").code


@pytest.mark.parametrize("runner", RUNNERS)
def test_weight_norm_folds_and_follows_swapped_weights(tmp_path, runner):
    torch.manual_seed(0)
    model, x = WeightNormed().eval(), torch.randn(2, 8, 16)
    path = aotc.export(model, (x,), tmp_path / "wn.aotc")
    assert "run once, at load" in _code(path)
    m = aotc.load(path, runner=runner)
    assert runner in m.runtime
    assert_matches(m(x), eager(model, (x,)))
    with torch.no_grad():   # another g and v: the folded weight is computed again
        model.conv.parametrizations.weight.original0.mul_(1.5)
        model.conv.parametrizations.weight.original1.add_(0.25)
    m.load_state_dict(model.state_dict())
    assert_matches(m(x), eager(model, (x,)))


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_matrix_of_index_arithmetic_folds(tmp_path, runner):
    x = torch.randn(3, 16)
    path = aotc.export(Dft(), (x,), tmp_path / "dft.aotc")
    assert "run once, at load" in _code(path)
    m = aotc.load(path, runner=runner)
    for _ in range(2):
        assert_matches(m(x), eager(Dft(), (x,)))


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_folded_output_is_a_fresh_tensor_per_call(tmp_path, runner):
    model, x = ConstantOut().eval(), torch.randn(2, 4)
    path = aotc.export(model, (x,), tmp_path / "c.aotc")
    m = aotc.load(path, runner=runner)
    first = m(x)[1]
    want = first.clone()
    first.zero_()              # the caller owns what it got
    second = m(x)[1]
    assert second.data_ptr() != first.data_ptr()
    assert torch.equal(second, want)
    assert_matches(second, torch.tanh(model.w.detach()) * 2)


def test_sizes_that_vary_are_not_folded(tmp_path):
    x = torch.randn(3, 16)
    seq = torch.export.Dim("n", min=2, max=64)
    path = aotc.export(Dft(), (x,), tmp_path / "dyn.aotc", dynamic_shapes=({1: seq},))
    assert "run once, at load" not in _code(path)
    for runner in RUNNERS:
        m = aotc.load(path, runner=runner)
        for n in (16, 24):
            y = torch.randn(3, n)
            assert_matches(m(y), eager(Dft(), (y,)))


def test_a_large_broadcast_of_a_constant_is_not_folded(tmp_path, monkeypatch):
    class Masked(torch.nn.Module):
        def forward(self, x):
            keep = torch.arange(x.shape[-1]) % 3 != 0
            return x * keep.expand(x.shape)

    x = torch.randn(64, 256)
    path = aotc.export(Masked(), (x,), tmp_path / "m.aotc")
    monkeypatch.setattr(folding, "FOLD_BYTES", 1024)   # the mask (16 KiB at bool) exceeds it
    assert "run once, at load" not in _code(path)
    monkeypatch.undo()
    assert_matches(aotc.load(path, runner="python")(x), eager(Masked(), (x,)))


def test_random_draws_are_not_folded(tmp_path):
    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand(4)

    x = torch.zeros(2, 4)
    path = aotc.export(Noisy(), (x,), tmp_path / "r.aotc")
    for runner in RUNNERS:
        m = aotc.load(path, runner=runner)
        assert not torch.equal(m(x), m(x)), runner


def test_a_cuda_artifact_folds_its_triton_kernels_through_the_interpreter(tmp_path):
    x = torch.randn(3, 16)
    path = aotc.export(Dft(), (x,), tmp_path / "dft_cuda.aotc", target="cuda:sm_90")
    m = aotc.load(path, device="cpu", interpret=True, runner="python")
    assert "run once, at load" in m.code
    assert_matches(m(x), eager(Dft(), (x,)))
