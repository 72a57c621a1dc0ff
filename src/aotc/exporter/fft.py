"""Fourier transforms, while export replays the captured graph: one call of aotc's own FFT op.

Artifacts hold no complex values (exporter/complex.py carries them as (real, imaginary) pairs,
a trailing dim of 2), so each of torch.fft's transforms becomes `aotc::fft(x, dims, mode)`
(aotc/nn.py): x real, or complex as pairs; the result as pairs. The runtimes run it with
torch.fft (runtime/aotc_ops.py, runtime/cpp/aotc_ops.cpp): pocketfft on the CPU, cuFFT on a
GPU, O(n log n) per dim, 16-bit floats computed in float32 (eager torch has no CPU FFT for
them). FNet mixes tokens this way: a real input, `fftn` over the sequence and hidden dims,
the real part kept.

Handled: torch.fft's fft, ifft, fftn, ifftn, fft2, ifft2, rfft, rfftn, rfft2, irfft, irfftn,
irfft2 (GFNet's and FNO's spectral filters), ihfft, ihfft2, ihfftn (hfft's are ATen
compositions of these), with signal sizes `s`/`n` (the input trimmed or
zero-padded first, as torch does), and ATen's _fft_r2c, _fft_c2c and _fft_c2r; others are
refused with an ExportError naming them (exporter/complex.py `call`).
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
    return Pairs(torch.ops.aotc.fft(t, _bits(dims), mode))


def inverse_real(x, dims, *, norm: str | None, sizes=None) -> torch.Tensor:
    """irfftn: pairs (a real input: its imaginary part 0) to a real tensor; `sizes` the output
    lengths of `dims` (torch's `s`; the last, one-sided one 2 (m - 1) for m bins by default).
    As torch does, the input is trimmed or zero-padded first: the other dims to their
    lengths, the one-sided dim to n // 2 + 1 bins."""
    if not isinstance(x, Pairs):
        x = pair(x, 0.0)
    _norm(norm)
    ndim = x.t.dim() - 1
    dims = [d % ndim for d in dims]
    sizes = [None] * len(dims) if sizes is None else list(sizes)
    n = sizes[-1] if sizes[-1] not in (None, -1) else 2 * (x.re.shape[dims[-1]] - 1)
    x = _sized(x, dims, [*sizes[:-1], n // 2 + 1])
    mode = fft_mode(inverse=True, onesided=True, pairs=True, norm=_NORMS[norm], last=dims[-1])
    return torch.ops.aotc.fft(x.t, _bits(dims), mode, n)


def _bits(dims) -> int:
    """aotc::fft's `dims`: a bit per transformed dim."""
    return sum(1 << d for d in set(dims))


def _norm(norm) -> None:
    if norm not in _NORMS:
        raise ExportError(f"an FFT with norm={norm!r}", where="torch.fft",
                          expected="None, 'backward', 'forward' or 'ortho'", found=repr(norm),
                          fix="use one of torch.fft's norms")


def _sized(x, dims, sizes):
    """x trimmed or zero-padded along `dims` to `sizes` (torch.fft's signal size `s` or `n`;
    None or -1 keeps a dim), as torch.fft does before a transform."""
    if sizes is None:
        return x
    pairs = isinstance(x, Pairs)
    t = x.t if pairs else x
    nd = t.dim() - pairs
    for d, n in zip(dims, sizes):
        if n is None or n == -1:
            continue
        if n < 1:
            raise ExportError("an FFT of a signal size below 1", where="torch.fft",
                              expected="s or n of at least 1", found=n, fix="pass a positive size")
        d %= nd
        if n < t.shape[d]:
            t = t.narrow(d, 0, n)
        elif n > t.shape[d]:
            t = torch.nn.functional.pad(t, [0, 0] * (t.dim() - 1 - d) + [0, n - t.shape[d]])
    return Pairs(t) if pairs else t


def _dims_of(x, dim, default, s=None):
    """The transformed dims: `dim`, else the last len(s) dims where a size is given, else the
    default (all dims for None)."""
    nd = (x.re if isinstance(x, Pairs) else x).dim()
    if dim is None and s is not None:
        return list(range(nd - len(s), nd))
    if dim is None:
        return list(range(nd)) if default is None else list(default)
    return [dim] if isinstance(dim, int) else list(dim)


def _many(inverse: bool, default, onesided: bool = False):
    """An n-d transform (s, dim, norm): the input sized to `s`, then one aotc::fft."""
    def call(x, s=None, dim=default, norm=None):
        dims = _dims_of(x, dim, default, s)
        return dft(_sized(x, dims, s), dims, inverse=inverse, norm=norm, onesided=onesided)
    return call


def _one(transform):
    """The 1-d form (n, dim) of an n-d transform (s, dim)."""
    return lambda x, n=None, dim=-1, norm=None: transform(x, [n], [dim], norm)


_SWAPPED = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}


def _ihfftn(default):
    """ihfftn, ihfft2 of a real signal: the conjugate of rfftn with the norm's scaling moved
    to the other direction."""
    rfftn = _many(False, default, onesided=True)

    def call(x, s=None, dim=default, norm=None):
        out = rfftn(x, s, dim, _SWAPPED.get(norm, norm))
        return Pairs(torch.stack([out.re, -out.im], -1))
    return call


def _r2c(x, dim, normalization, onesided):
    norm = (None, "ortho", "forward")[normalization]
    return dft(x, list(dim), inverse=False, norm=norm, onesided=onesided)


def _c2c(x, dim, normalization, forward):
    norm = ((None, "ortho", "forward") if forward else ("forward", "ortho", None))[normalization]
    return dft(x, list(dim), inverse=not forward, norm=norm)


def _irfftn(default):
    def call(x, s=None, dim=default, norm=None):
        return inverse_real(x, _dims_of(x, dim, default, s), norm=norm, sizes=s)
    return call


def _c2r(x, dim, normalization, last_dim_size):
    norm = ("forward", "ortho", None)[normalization]
    return inverse_real(x, list(dim), norm=norm, sizes=[None] * (len(dim) - 1) + [last_dim_size])


HANDLERS = {
    aten.fft_fft.default: _one(_many(False, None)), aten.fft_ifft.default: _one(_many(True, None)),
    aten.fft_rfft.default: _one(_many(False, None, True)),
    aten.fft_fftn.default: _many(False, None), aten.fft_ifftn.default: _many(True, None),
    aten.fft_rfftn.default: _many(False, None, True),
    aten.fft_fft2.default: _many(False, (-2, -1)), aten.fft_ifft2.default: _many(True, (-2, -1)),
    aten.fft_rfft2.default: _many(False, (-2, -1), True),
    aten._fft_r2c.default: _r2c, aten._fft_c2c.default: _c2c, aten._fft_c2r.default: _c2r,
    aten.fft_irfft.default: _one(_irfftn(None)), aten.fft_irfftn.default: _irfftn(None),
    aten.fft_irfft2.default: _irfftn((-2, -1)),
    aten.fft_ihfft.default: _one(_ihfftn(None)), aten.fft_ihfftn.default: _ihfftn(None),
    aten.fft_ihfft2.default: _ihfftn((-2, -1)),
}
