"""Fourier transforms as real matrix products, while export replays the captured graph.

Artifacts hold no complex values (exporter/complex.py carries them as (real, imaginary) pairs),
and neither backend has an FFT kernel, so a discrete Fourier transform along a dim of size n is
computed as products with the n x n matrices cos(2 pi jk / n) and sin(2 pi jk / n): for
x = a + ib, the forward transform is (a C + b S) + i (b C - a S), the inverse the same with
the sines' sign flipped. The matrices depend on n only, so constant folding makes them weights
of the artifact, and the products run on the vendor BLAS (FNet mixes tokens this way: a real
input, `fftn` over the sequence and hidden dims, the real part kept). O(n^2) per dim instead of
O(n log n): at the sizes of such models (n up to a few thousand) a product at BLAS speed.
The angles are reduced modulo n in integers first, so they stay exact for large n.

Handled: torch.fft's fft, ifft, fftn, ifftn, fft2, ifft2, rfft, rfftn, rfft2 (without a signal
size `s`/`n` other than the input's) and ATen's _fft_r2c and _fft_c2c; others are refused with
an ExportError naming them (exporter/complex.py `call`).
"""
from __future__ import annotations

import math

import torch

from aotc.errors import ExportError
from aotc.exporter.complex import Pairs, pair, parts

aten = torch.ops.aten
_SCALE = {None: (False, True), "backward": (False, True), "forward": (True, False),
          "ortho": ("sqrt", "sqrt")}   # norm -> (scaled forward, scaled inverse): by 1/n


def _matrices(n: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of 2 pi jk / n; exact at multiples of a quarter turn (so a real signal's
    bins that are real, as its mean and Nyquist bins, get an imaginary part of exactly 0)."""
    k = torch.arange(n, dtype=torch.int64, device=device)
    m = torch.remainder(torch.outer(k, k), n)
    turns = m.to(torch.float64) * (2 * math.pi / n)
    quarter = torch.remainder(4 * m, n) == 0
    q = torch.div(4 * m, n, rounding_mode="floor")   # which quarter turn, where exact
    exact_cos = torch.where(q == 0, 1.0, torch.where(q == 2, -1.0, 0.0)).to(torch.float64)
    exact_sin = torch.where(q == 1, 1.0, torch.where(q == 3, -1.0, 0.0)).to(torch.float64)
    cos = torch.where(quarter, exact_cos, torch.cos(turns))
    sin = torch.where(quarter, exact_sin, torch.sin(turns))
    return cos.to(dtype), sin.to(dtype)


def _along(x, d: int, inverse: bool, scale) -> Pairs:
    """The transform of `x` (pairs, or a real tensor) along its dim `d`."""
    a, b = parts(x)
    real = isinstance(b, float)
    a = a.movedim(d, -1)
    n = a.shape[-1]
    c, s = _matrices(n, a.dtype, a.device)
    sign = -1.0 if inverse else 1.0
    if real:
        re, im = a @ c, -sign * (a @ s)
    else:
        b = b.movedim(d, -1)
        re, im = a @ c + sign * (b @ s), b @ c - sign * (a @ s)
    if scale:
        f = 1.0 / (math.sqrt(n) if scale == "sqrt" else n)
        re, im = re * f, im * f
    return pair(re.movedim(-1, d), im.movedim(-1, d))


def dft(x, dims, *, inverse: bool, norm: str | None, onesided: bool = False):
    if norm not in _SCALE:
        raise ExportError(f"an FFT with norm={norm!r}", where="torch.fft",
                          expected="None, 'backward', 'forward' or 'ortho'", found=repr(norm),
                          fix="use one of torch.fft's norms")
    scale = _SCALE[norm][1 if inverse else 0]
    ndim = (x.re if isinstance(x, Pairs) else x).dim()
    dims = [d % ndim for d in dims]
    out = x
    for d in reversed(dims):   # the last dim first: a one-sided transform trims it at the end
        out = _along(out, d, inverse, scale)
    if onesided:
        last = dims[-1]
        keep = out.re.shape[last] // 2 + 1
        out = Pairs(out.t.narrow(last, 0, keep))
    return out


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


HANDLERS = {
    aten.fft_fft.default: _one(False), aten.fft_ifft.default: _one(True, op="ifft"),
    aten.fft_rfft.default: _one(False, True, "rfft"),
    aten.fft_fftn.default: _many(False, None), aten.fft_ifftn.default: _many(True, None, op="ifftn"),
    aten.fft_rfftn.default: _many(False, None, True, "rfftn"),
    aten.fft_fft2.default: _many(False, (-2, -1), op="fft2"),
    aten.fft_ifft2.default: _many(True, (-2, -1), op="ifft2"),
    aten.fft_rfft2.default: _many(False, (-2, -1), True, "rfft2"),
    aten._fft_r2c.default: _r2c, aten._fft_c2c.default: _c2c,
}
