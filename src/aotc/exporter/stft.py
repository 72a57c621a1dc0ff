"""Short-time Fourier transforms, while export replays the captured graph (exporter/complex.py).

`torch.stft` (torchaudio's Spectrogram and MelSpectrogram, Whisper's log-mel features) is
captured as ATen's stft: frames of the signal (`unfold`), times the window, then one aotc::fft
over the frames (exporter/fft.py), the result as (real, imaginary) pairs laid out as torch
lays out its result: [..., frequencies, frames]. `torch.istft` (vocoders' heads) is the
inverse: an inverse real FFT per frame, times the window, overlap-added as a sum of shifted
slices (pointwise work codegen fuses), divided by the overlap-added squared window (a value
of sizes alone: folded at load, runtime/folding.py), trimmed to the signal.

Refused with an ExportError: a complex signal or window, `align_to_window`, a two-sided
inverse (its output would be complex).
"""
from __future__ import annotations

import torch

from aotc.errors import ExportError
from aotc.exporter.complex import Pairs
from aotc.exporter.fft import dft, inverse_real

aten = torch.ops.aten
F = torch.nn.functional


def _refuse(what: str, found) -> None:
    raise ExportError(f"a short-time Fourier transform with {what}, which aotc does not "
                      "compute", where="torch.stft / torch.istft", expected="a real signal and "
                      "window, align_to_window unset, a one-sided inverse", found=found,
                      fix="compute this transform outside the exported model")


def _window(window, n_fft: int, win_length: int | None, like: torch.Tensor) -> torch.Tensor:
    """The window padded on both sides to n_fft, as torch centers a shorter one."""
    if isinstance(window, Pairs):
        _refuse("a complex window", "a complex window")
    win_length = win_length or n_fft
    if window is None:
        window = torch.ones(win_length, dtype=like.dtype, device=like.device)
    if win_length < n_fft:
        left = (n_fft - win_length) // 2
        window = F.pad(window, [left, n_fft - win_length - left])
    return window


def stft(x, n_fft, hop_length=None, win_length=None, window=None, normalized=False,
         onesided=None, return_complex=None, align_to_window=None):
    if isinstance(x, Pairs):
        _refuse("a complex signal", "a complex input")
    if align_to_window:
        _refuse("align_to_window", "align_to_window=True")
    hop = hop_length or n_fft // 4
    frames = x.unfold(-1, n_fft, hop) * _window(window, n_fft, win_length, x)
    out = dft(frames, [-1], inverse=False, norm="ortho" if normalized else None,
              onesided=True if onesided is None else onesided)
    t = out.t.transpose(-3, -2)       # [..., frames, freq, 2] -> [..., freq, frames, 2]
    return t if return_complex is False else Pairs(t)


def stft_center(x, n_fft, hop_length=None, win_length=None, window=None, center=True,
                pad_mode="reflect", normalized=False, onesided=None, return_complex=None,
                align_to_window=None):
    if center and not isinstance(x, Pairs):
        shape = x.shape
        x = F.pad(x.reshape(-1, 1, shape[-1]), [n_fft // 2, n_fft // 2], mode=pad_mode)
        x = x.reshape(*shape[:-1], x.shape[-1])
    return stft(x, n_fft, hop_length, win_length, window, normalized, onesided,
                return_complex, align_to_window)


def _overlap_add(frames: torch.Tensor, hop: int) -> torch.Tensor:
    """[..., n, size] frames summed into a signal, frame f starting at f * hop: the sum over
    k of the frames' k-th hop-long slice, laid end to end and shifted by k hops."""
    n, size = frames.shape[-2], frames.shape[-1]
    k = -(-size // hop)
    frames = F.pad(frames, [0, k * hop - size])
    out = None
    for i in range(k):
        part = frames[..., i * hop:(i + 1) * hop].reshape(*frames.shape[:-2], n * hop)
        part = F.pad(part, [i * hop, (k - 1 - i) * hop])
        out = part if out is None else out + part
    return out


def istft(x, n_fft, hop_length=None, win_length=None, window=None, center=True,
          normalized=False, onesided=None, length=None, return_complex=False):
    if not isinstance(x, Pairs):
        _refuse("a real spectrum", "a real input")
    freq = x.re.shape[-2]
    if return_complex or onesided is False or (onesided is None and freq == n_fft and n_fft > 2):
        _refuse("a two-sided spectrum", f"{freq} frequencies for n_fft {n_fft}")
    hop = hop_length or n_fft // 4
    spectra = Pairs(x.t.transpose(-3, -2))                    # [..., frames, freq, 2]
    frames = inverse_real(spectra, [-1], norm="ortho" if normalized else None, sizes=[n_fft])
    win = _window(window, n_fft, win_length, frames)
    signal = _overlap_add(frames * win, hop)
    envelope = _overlap_add((win * win).expand(frames.shape[-2], n_fft), hop)
    end = n_fft + hop * (frames.shape[-2] - 1)
    start = n_fft // 2 if center else 0
    stop = end - n_fft // 2 if center else end
    if length is not None:
        stop = start + length
    y = signal[..., start:min(stop, end)] / envelope[start:min(stop, end)]
    return F.pad(y, [0, stop - end]) if stop > end else y


HANDLERS = {aten.stft.default: stft, aten.stft.center: stft_center, aten.istft.default: istft}
