"""Fourier transforms (exporter/fft.py) as calls of aotc::fft (runtime/fourier.py), which both
runners run with torch.fft: torch.fft's transforms and ATen's against eager in float64 (signal
sizes that pad or trim the input too) and at FNet's shape in float32, 16-bit inputs computed in
float32, the same results from both runners, a plan whose aotc::fft names dims or sizes its
input cannot take refused with an ArtifactError."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import aotc
from aotc.errors import ArtifactError, ExportError
from aotc.runtime.fourier import fft, fft_mode


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
    "irfft-roundtrip": lambda x: torch.fft.irfft(torch.fft.rfft(x), n=x.shape[-1]),
    "irfft-odd": lambda x: torch.fft.irfft(torch.fft.rfft(x, norm="ortho"), n=9, norm="ortho"),
    "irfft2-filter": lambda x: torch.fft.irfft2(torch.fft.rfft2(x) * (0.5 + 0.25j),
                                                s=x.shape[-2:]),     # GFNet's global filter
    "irfftn-of-real": lambda x: torch.fft.irfftn(x, dim=(0, 2), norm="forward"),
    "fft-padded": lambda x: torch.view_as_real(torch.fft.fft(x, n=16)),
    "rfft-trimmed": lambda x: torch.fft.rfft(x, n=7, dim=1).abs(),
    "fftn-s": lambda x: torch.fft.fftn(x, s=(6, 14)).imag,       # the last two dims
    "irfft-long": lambda x: torch.fft.irfft(torch.fft.rfft(x), n=40),
    "irfftn-s": lambda x: torch.fft.irfftn(torch.fft.rfftn(x), s=(3, 9, 7)),
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


def test_a_signal_size_below_one_is_refused(tmp_path):
    model = Transform(lambda x: torch.fft.rfft(x, n=0).abs())
    with pytest.raises(RuntimeError, match="data points"):   # eager refuses it too
        model(torch.randn(3, 10))
    with pytest.raises(ExportError):
        aotc.export(model, (torch.randn(3, 10),), tmp_path / "f.aotc")


@pytest.mark.parametrize("runner", ["python", "cpp"])
def test_both_runners_call_torch_fft(tmp_path, runner):
    model, x = Transform(CASES["fnet"]), torch.randn(2, 64, 96)
    path = aotc.export(model, (x,), tmp_path / "f.aotc")
    m = aotc.load(path, runner=runner)
    assert runner in m.runtime
    assert "aotc::fft" in str(aotc.load(path).artifact.plan("forward").to_json())
    torch.testing.assert_close(m(x), model(x), rtol=1e-5, atol=1e-5)


def test_16_bit_inputs_are_transformed_in_float32():
    x = torch.randn(3, 16).to(torch.bfloat16)   # (eager has no CPU FFT for bfloat16)
    got = fft(x, 1 << 1, fft_mode(inverse=False, onesided=True, pairs=False, norm="backward",
                                   last=1))
    assert got.dtype == torch.bfloat16 and got.shape == (3, 9, 2)
    torch.testing.assert_close(got, torch.view_as_real(torch.fft.rfft(x.float())).to(x.dtype))


@pytest.mark.parametrize("dims,mode", [(1 << 5, 0), (0, 0), (1, 3 << 3), (1, 2 | 1 << 5 + 3)])
def test_a_plan_asking_for_dims_or_modes_its_input_lacks_is_refused(dims, mode):
    with pytest.raises(ArtifactError, match="aotc::fft"):
        fft(torch.randn(4, 6), dims, mode)


@pytest.mark.parametrize("runner", ["python", "cpp"])
def test_a_hostile_plan_naming_dims_beyond_its_input_gets_a_typed_error(tmp_path, runner):
    from hostile import edit_json

    x = torch.randn(2, 8, 6)
    path = aotc.export(Transform(CASES["fnet"]), (x,), tmp_path / "f.aotc")

    def widen(doc):
        for step in doc["steps"]:
            if isinstance(step, dict) and step.get("op") == "aotc::fft.default":
                step["args"][1] = 1 << 9
    edit_json(path, "plans/forward.json", widen)
    with pytest.raises(ArtifactError, match="aotc::fft"):
        aotc.load(path, runner=runner)(x)


def test_an_inverse_real_transform_longer_than_twice_its_bins_is_refused():
    mode = fft_mode(inverse=True, onesided=True, pairs=True, norm="backward", last=1)
    spectrum = torch.randn(4, 6, 2)
    assert fft(spectrum, 1 << 1, mode, 11).shape == (4, 11)
    with pytest.raises(ArtifactError, match="aotc::fft"):
        fft(spectrum, 1 << 1, mode, 13)     # zeros a plan could make any length


def test_a_training_step_with_a_transform_is_refused_by_name(tmp_path):
    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, 6)

        def forward(self, x):
            return torch.fft.fftn(self.a(x), dim=(1, 2)).real

    with pytest.raises(ExportError, match="training step's forward computes with complex"):
        aotc.export(Mixer(), (torch.randn(2, 8, 6),), tmp_path / "t.aotc", train=True)
    assert not (tmp_path / "t.aotc").exists()


FFT_OPINFOS = ("fft.fft", "fft.fft2", "fft.fftn", "fft.hfft", "fft.hfft2", "fft.hfftn",
               "fft.rfft", "fft.rfft2", "fft.rfftn", "fft.ifft", "fft.ifft2", "fft.ifftn",
               "fft.ihfft", "fft.ihfft2", "fft.ihfftn", "fft.irfft", "fft.irfft2", "fft.irfftn",
               "fft.fftshift", "fft.ifftshift")


@pytest.mark.parametrize("name", FFT_OPINFOS)
def test_opinfo_samples_of_real_signals_match_eager_in_float64(tmp_path, name):
    """Every sample of the OpInfo with a real input (sizes, dims, norms), the complex result
    compared as pairs."""
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == name)
    samples = [s for s in op.sample_inputs("cpu", torch.float64)
               if isinstance(s.input, torch.Tensor) and not s.input.is_complex()]
    assert samples
    for i, s in enumerate(samples):
        def fn(x, s=s):
            y = op.op(x, *s.args, **s.kwargs)
            return torch.view_as_real(y.resolve_conj()) if y.is_complex() else y
        path = aotc.export(Transform(fn), (s.input,), tmp_path / f"{i}.aotc", codegen=False)
        torch.testing.assert_close(aotc.load(path)(s.input), fn(s.input), rtol=1e-9, atol=1e-9,
                                   msg=lambda m, s=s: f"{name} {s.kwargs}: {m}")
