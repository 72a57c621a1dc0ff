"""Short-time Fourier transforms (exporter/stft.py): torch.stft's and torch.istft's options
against eager in float64, a spectrogram model in float32 on both runners with the inverse's
window envelope folded at load, and the refusals."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import aotc
from aotc.errors import ExportError

HANN = torch.hann_window(64, dtype=torch.float64)


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _spec(x, **kw):
    return torch.view_as_real(torch.stft(x, 64, return_complex=True, **kw))


STFT = {
    "hann-hop16": lambda x: _spec(x, hop_length=16, window=HANN),
    "short-window": lambda x: _spec(x, hop_length=10, win_length=40, window=HANN[:40]),
    "no-window-normalized": lambda x: _spec(x, normalized=True),
    "uncentered-two-sided": lambda x: _spec(x, hop_length=24, window=HANN, center=False,
                                            onesided=False),
    "constant-padding": lambda x: _spec(x, hop_length=16, window=HANN, pad_mode="constant"),
    "unbatched": lambda x: _spec(x[0], hop_length=16, window=HANN),
    "power-log": lambda x: torch.stft(x, 64, 16, window=HANN, return_complex=True)
    .abs().pow(2).clamp_min(1e-10).log(),
}


def _round_trip(x, **kw):
    kw.setdefault("window", HANN)
    spec = torch.stft(x, 64, kw.get("hop_length", 16), window=kw["window"],
                      center=kw.get("center", True), return_complex=True)
    return torch.istft(spec * 0.5, 64, **kw)


ISTFT = {
    "round-trip": lambda x: _round_trip(x, hop_length=16),
    "length": lambda x: _round_trip(x, hop_length=16, length=x.shape[-1]),
    "longer-than-frames": lambda x: _round_trip(x, hop_length=16, length=x.shape[-1] + 50),
    "hop-not-dividing": lambda x: _round_trip(x, hop_length=24),
    "uncentered": lambda x: _round_trip(x, hop_length=16, center=False, window=HANN * 0.9 + 0.1),
}


@pytest.mark.parametrize("name", sorted(STFT) + sorted(ISTFT))
def test_matches_eager_in_float64(tmp_path, name):
    fn = {**STFT, **ISTFT}[name]
    x = torch.randn(2, 500, dtype=torch.float64)
    path = aotc.export(Fn(fn), (x,), tmp_path / "s.aotc")
    torch.testing.assert_close(aotc.load(path)(x), fn(x), rtol=1e-9, atol=1e-9)


class LogMel(nn.Module):
    """Whisper's features: a Hann-windowed power spectrogram through a mel filter bank."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(128))
        self.register_buffer("mel", torch.rand(40, 65))

    def forward(self, audio):
        spec = torch.stft(audio, 128, 32, window=self.window, return_complex=True)
        power = spec[..., :-1].abs() ** 2
        return (self.mel @ power).clamp(min=1e-10).log10()


@pytest.mark.parametrize("runner", ["python", "cpp"])
def test_a_log_mel_spectrogram_on_both_runners(tmp_path, runner):
    model, audio = LogMel(), torch.randn(2, 4000)
    path = aotc.export(model, (audio,), tmp_path / "mel.aotc")
    m = aotc.load(path, runner=runner)
    assert runner in m.runtime
    torch.testing.assert_close(m(audio), model(audio), rtol=1e-4, atol=1e-4)


def test_the_inverse_window_envelope_is_folded_at_load(tmp_path):
    fn = ISTFT["length"]
    x = torch.randn(2, 500, dtype=torch.float64)
    path = aotc.export(Fn(fn), (x,), tmp_path / "i.aotc")
    assert "run once, at load" in aotc.load(path, runner="python").code


def test_a_two_sided_inverse_is_refused_by_name(tmp_path):
    def fn(x):
        spec = torch.stft(x, 64, 16, window=HANN, return_complex=True, onesided=False)
        return torch.istft(spec, 64, 16, window=HANN, onesided=False, return_complex=True).real

    with pytest.raises(ExportError, match="two-sided"):
        aotc.export(Fn(fn), (torch.randn(2, 500, dtype=torch.float64),), tmp_path / "t.aotc")
