"""Ops whose arguments are computed from a dynamic size: size-valued scalars in pointwise
math, `arange` with a symbolic end or start, floor-division and modulo of values that may be
negative (`roll`), padding by index arithmetic (reflect, replicate, circular), upsampling by
size or scale (scales that are ratios of sizes included); each checked against eager at sizes
other than the example's, on the C++ backend and through Triton's interpreter. A float of sizes
that kernels cannot compute (a root) is refused by name, and so is a declared dynamic dim that
the traced code fixed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import aotc
from aotc.errors import ExportError
from aotc.exporter import _refuse_specialized

W = torch.export.Dim("W", min=4, max=64)

CASES = {
    "divide-by-size": lambda x: x / x.shape[-1],
    "arange-over-size": lambda x: x + torch.arange(x.shape[-1]) / x.shape[-1],
    "arange-start-step": lambda x: x * torch.arange(-1, 3 * x.shape[-1] - 1, 3),
    "arange-symbolic-start": lambda x: torch.cat([x, x], -1)[..., x.shape[-1]:] + torch.arange(
        x.shape[-1], 2 * x.shape[-1]),
    "roll": lambda x: torch.roll(x, 2, -1),
    "roll-negative": lambda x: torch.roll(x, -3, -1),
    "pad-reflect": lambda x: F.pad(x, (1, 2, 1, 2), mode="reflect"),
    "pad-replicate": lambda x: F.pad(x, (1, 2, 1, 2), mode="replicate"),
    "pad-circular": lambda x: F.pad(x, (1, 2, 1, 2), mode="circular"),
    "upsample-by-size": lambda x: F.interpolate(x, size=(x.shape[2] * 2, x.shape[3] * 2)),
    "upsample-bilinear-x2": lambda x: F.interpolate(x, scale_factor=2.0, mode="bilinear"),
    "upsample-bicubic-x2": lambda x: F.interpolate(x, scale_factor=2.0, mode="bicubic"),
    # scales that vary with the size: a ratio of two size expressions, computed in float64
    "bilinear-to-fixed-size": lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"),
    "bilinear-align-corners": lambda x: F.interpolate(
        x, size=(x.shape[2] * 2, x.shape[3] * 2), mode="bilinear", align_corners=True),
    "nearest-exact-to-size": lambda x: F.interpolate(
        x, size=(x.shape[2] + 1, 2 * x.shape[3] - 1), mode="nearest-exact"),
}


B = torch.export.Dim("B", min=1, max=16)
_W3 = torch.randn(4, 4, 3)

# A dynamic batch through the ops aotc decomposes itself for it (constant padding, a crop too;
# unfold's padding; baddbmm of a broadcast input) and a view of a convolution's output; the
# models in which torch's kernels fixed the batch there are tests/test_dynamic_zoo.py.
BATCH_CASES = {
    "pad-constant": lambda x: F.pad(x, (1, 2, 0, 1), value=0.5),
    "pad-crop": lambda x: F.pad(x, (-1, 2, 1, -2)),
    "unfold": lambda x: F.unfold(x, kernel_size=(3, 1), padding=(1, 0)),
    "baddbmm-broadcast": lambda x: torch.baddbmm(
        x.reshape(-1, 6, 6)[:, :1, :], x.reshape(-1, 6, 6), x.reshape(-1, 6, 6).transpose(1, 2),
        beta=0.5, alpha=2.0),
    "conv-then-view": lambda x: F.gelu(F.conv1d(x.flatten(2), _W3, padding=1)).transpose(
        1, 2).reshape(-1, 4) * 2,
}


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("target", ["cpu", "cuda:sm_90"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_at_other_sizes(tmp_path, name, target):
    fn = CASES[name]
    path = aotc.export(Fn(fn), (torch.randn(2, 4, 6, 6),), tmp_path / "d.aotc",
                       dynamic_shapes=({3: W},), target=target)
    m = aotc.load(path, device="cpu", interpret=True) if target != "cpu" else aotc.load(path)
    assert "W" in m.signature()
    for width in (5, 10, 17):
        x = torch.randn(2, 4, 6, width)
        torch.testing.assert_close(m(x), fn(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["cpu", "cuda:sm_90"])
@pytest.mark.parametrize("name", sorted(BATCH_CASES))
def test_a_dynamic_batch_through_ops_whose_kernels_read_ints(tmp_path, name, target):
    fn = BATCH_CASES[name]
    path = aotc.export(Fn(fn), (torch.randn(2, 4, 6, 6),), tmp_path / "b.aotc",
                       dynamic_shapes=({0: B},), target=target)
    m = aotc.load(path, device="cpu", interpret=True) if target != "cpu" else aotc.load(path)
    assert "B" in m.signature()
    for batch in (1, 3, 16):
        x = torch.randn(batch, 4, 6, 6)
        torch.testing.assert_close(m(x), fn(x), rtol=1e-5, atol=1e-5)


def test_a_float_that_varies_with_a_size_is_refused_by_name(tmp_path):
    fn = Fn(lambda x: x * (1.0 / x.shape[-1]) ** 0.5)
    with pytest.raises(ExportError, match="float from a dynamic size that kernels cannot"):
        aotc.export(fn, (torch.randn(2, 4, 6, 6),), tmp_path / "f.aotc", dynamic_shapes=({3: W},))
    assert not (tmp_path / "f.aotc").exists()


def test_a_dynamic_dim_the_trace_fixed_is_refused():
    inputs = [{"name": "x", "shape": [2, 4, 6, 8]}]
    with pytest.raises(ExportError, match="declared dynamic \\(W\\) but the traced code fixed"):
        _refuse_specialized(({3: W},), inputs)
    _refuse_specialized(({3: W},), [{"name": "x", "shape": [2, 4, 6, "W"]}])
