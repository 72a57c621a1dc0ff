"""Fourier transforms, while export replays the captured graph: one call of aotc's own FFT op.

Artifacts hold no complex values (exporter/complex.py carries them as (real, imaginary) pairs,
a trailing dim of 2), so each of torch.fft's transforms becomes `aotc::fft(x, dims, mode)`
(aotc/nn.py): x real, or complex as pairs; the result as pairs. The runtimes run it with
torch.fft (runtime/aotc_ops.py, runtime/cpp/aotc_ops.cpp): pocketfft on the CPU, cuFFT on a
GPU, O(n log n) per dim, 16-bit floats computed in float32 (eager torch has no CPU FFT for
them). FNet mixes tokens this way: a real input, `fftn` over the sequence and hidden dims,
the real part kept.

Handled: torch.fft's fft, ifft, fftn, ifftn, fft2, ifft2, rfft, rfftn, rfft2 (without a signal
size `s`/`n` other than the input's), irfft, irfftn, irfft2 (a real output of any length up to
twice the bins along the halved dim, the others as the input's: GFNet's and FNO's spectral
filters) and ATen's _fft_r2c, _fft_c2c and _fft_c2r; others are refused with an ExportError
naming them (exporter/complex.py `call`).
"""
from __future__ import annotations

import torch

import aotc.nn  # noqa: F401 - registers aotc::fft
from aotc.errors import ExportError
from aotc.exporter.complex import Pairs, pair
from aotc.runtime.fourier import fft_mode

aten = torch.ops.aten
_NORMS = {None: "backward", "backward": "backward", "forward": "forward", "ortho": "ortho"}


def dft(x, dims, *, inverse: bool, norm: str | None, onesided: bool = False) -> Pairs:
    _norm(norm)
    pairs = isinstance(x, Pairs)
    t = x.t if pairs else x
    ndim = t.dim() - pairs
    dims = [d % ndim for d in dims]
    mode = fft_mode(inverse=inverse, onesided=onesided, pairs=pairs, norm=_NORMS[norm],
                    last=dims[-1] if onesided else 0)
    return Pairs(torch.ops.aotc.fft(t, sum(1 << d for d in set(dims)), mode))


def inverse_real(x, dims, *, norm: str | None, size: int | None = None) -> torch.Tensor:
    """irfftn: pairs (a real input: its imaginary part 0) to a real tensor whose last
    transformed dim is `size` long (2 (m - 1) for None, m its bins)."""
    if not isinstance(x, Pairs):
        x = pair(x, 0.0)
    _norm(norm)
    ndim = x.t.dim() - 1
    dims = [d % ndim for d in dims]
    bins = x.re.shape[dims[-1]]
    if size is not None and not 1 <= size <= 2 * bins:
        raise ExportError("an inverse real FFT longer than twice its bins", where="torch.fft",
                          expected=f"n between 1 and {2 * bins}", found=size,
                          fix="pad the spectrum before the transform")
    mode = fft_mode(inverse=True, onesided=True, pairs=True, norm=_NORMS[norm], last=dims[-1])
    return torch.ops.aotc.fft(x.t, sum(1 << d for d in set(dims)), mode, size or 0)


def _norm(norm) -> None:
    if norm not in _NORMS:
        raise ExportError(f"an FFT with norm={norm!r}", where="torch.fft",
                          expected="None, 'backward', 'forward' or 'ortho'", found=repr(norm),
                          fix="use one of torch.fft's norms")


def _whole(x, sizes, dims, op: str) -> None:
    """Refuse a signal size that pads or trims the input (not computed here)."""
    if sizes is None:
        return
    have = [(x.re if isinstance(x, Pairs) else x).shape[d] for d in dims]
    if list(sizes) != have:
        raise ExportError(f"torch.fft.{op} with a signal size other than the input's",
                          where=f"aten.fft_{op}", expected=f"s or n = {have} (or None)",
                          found=list(sizes), fix="pad or slice the input before the transform")


def _dims_of(x, dim, default):
    nd = (x.re if isinstance(x, Pairs) else x).dim()
    if dim is None:
        return list(range(nd)) if default is None else list(default)
    return [dim] if isinstance(dim, int) else list(dim)


def _one(inverse: bool, onesided: bool = False, op: str = "fft"):
    def call(x, n=None, dim=-1, norm=None):
        _whole(x, None if n is None else [n], [dim], op)
        return dft(x, [dim], inverse=inverse, norm=norm, onesided=onesided)
    return call


def _many(inverse: bool, default, onesided: bool = False, op: str = "fftn"):
    def call(x, s=None, dim=default, norm=None):
        dims = _dims_of(x, dim, None if default is None else default)
        _whole(x, s, dims, op)
        return dft(x, dims, inverse=inverse, norm=norm, onesided=onesided)
    return call


def _r2c(x, dim, normalization, onesided):
    norm = (None, "ortho", "forward")[normalization]
    return dft(x, list(dim), inverse=False, norm=norm, onesided=onesided)


def _c2c(x, dim, normalization, forward):
    norm = ((None, "ortho", "forward") if forward else ("forward", "ortho", None))[normalization]
    return dft(x, list(dim), inverse=not forward, norm=norm)


def _irfft(x, n=None, dim=-1, norm=None):
    return inverse_real(x, [dim], norm=norm, size=n)


def _irfftn(default):
    def call(x, s=None, dim=default, norm=None):
        nd = (x.re if isinstance(x, Pairs) else x).dim()
        dims = list(range(nd - len(s), nd)) if dim is None and s is not None else \
            _dims_of(x, dim, default)
        if s is not None:
            _whole(x, list(s)[:-1], dims[:-1], "irfftn")
        return inverse_real(x, dims, norm=norm, size=None if s is None else list(s)[-1])
    return call


def _c2r(x, dim, normalization, last_dim_size):
    norm = ("forward", "ortho", None)[normalization]
    return inverse_real(x, list(dim), norm=norm, size=last_dim_size)


HANDLERS = {
    aten.fft_fft.default: _one(False), aten.fft_ifft.default: _one(True, op="ifft"),
    aten.fft_rfft.default: _one(False, True, "rfft"),
    aten.fft_fftn.default: _many(False, None), aten.fft_ifftn.default: _many(True, None, op="ifftn"),
    aten.fft_rfftn.default: _many(False, None, True, "rfftn"),
    aten.fft_fft2.default: _many(False, (-2, -1), op="fft2"),
    aten.fft_ifft2.default: _many(True, (-2, -1), op="ifft2"),
    aten.fft_rfft2.default: _many(False, (-2, -1), True, "rfft2"),
    aten._fft_r2c.default: _r2c, aten._fft_c2c.default: _c2c, aten._fft_c2r.default: _c2r,
    aten.fft_irfft.default: _irfft, aten.fft_irfftn.default: _irfftn(None),
    aten.fft_irfft2.default: _irfftn((-2, -1)),
}
