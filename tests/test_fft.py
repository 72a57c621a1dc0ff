"""Fourier transforms (exporter/fft.py) as products with cos and sin matrices: torch.fft's
transforms and ATen's against eager, in float64 (where the products must agree to rounding)
and float32 at FNet's shape (a real input, fftn over sequence and hidden, the real part kept);
a signal size that pads or trims the input is refused with an ExportError."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import aotc
from aotc.errors import ExportError


class Transform(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


CASES = {
    "fnet": lambda x: torch.fft.fftn(x, dim=(1, 2)).real * 2 + x,
    "fft-ortho": lambda x: torch.view_as_real(torch.fft.fft(x, dim=1, norm="ortho")),
    "rfft-abs": lambda x: torch.fft.rfft(x).abs(),
    "fft2-ifft": lambda x: torch.fft.ifft(torch.fft.fft2(x)).real,
    "rfft2-forward": lambda x: torch.view_as_real(torch.fft.rfft2(x, norm="forward")),
    "ifftn-of-pairs": lambda x: torch.view_as_real(torch.fft.ifftn(x * (1 + 2j), dim=(0, 2))),
    "rfftn-abs": lambda x: torch.fft.rfftn(x).abs(),
    "rfft-real-bins": lambda x: torch.fft.rfft(x)[..., [0, -1]].imag,   # exactly 0
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_transforms_match_eager_in_float64(tmp_path, name):
    model, x = Transform(CASES[name]), torch.randn(2, 12, 10, dtype=torch.float64)
    path = aotc.export(model, (x,), tmp_path / "f.aotc")
    torch.testing.assert_close(aotc.load(path)(x), model(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("codegen", [True, False])
def test_fnet_mixing_in_float32(tmp_path, codegen):
    model, x = Transform(CASES["fnet"]), torch.randn(2, 64, 96)
    path = aotc.export(model, (x,), tmp_path / "f.aotc", codegen=codegen)
    torch.testing.assert_close(aotc.load(path)(x), model(x), rtol=1e-4, atol=2e-4)


def test_a_signal_size_other_than_the_inputs_is_refused(tmp_path):
    model = Transform(lambda x: torch.fft.rfft(x, n=16).abs())
    with pytest.raises(ExportError, match="signal size other than the input's"):
        aotc.export(model, (torch.randn(3, 10),), tmp_path / "f.aotc")
