"""Complex numbers as pairs of reals, while export replays the captured graph.

Rotary embeddings are often written with complex numbers (LLaMA's reference code, DeepSeek-V2,
Llama 4, torchtitan): `view_as_complex(x.reshape(..., -1, 2)) * freqs_cis`, then `view_as_real`.
Neither backend has complex kernels, and artifacts hold no complex dtypes, so the replay
(exporter/decomp.py) carries each complex value as a real tensor with a trailing dim of 2
(real, imaginary), `Pairs`, and computes complex ops with real ones: a product becomes the four
real products, `view_as_real` and `view_as_complex` become nothing. Shape ops move their dims
past the trailing one. A complex weight or buffer is stored as its real view (its shape ends
in 2). An op this table does not know, or a complex input or output of the model, is an
ExportError that names it.
"""
from __future__ import annotations

import torch

from aotc.errors import ExportError

aten = torch.ops.aten
REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32,
        torch.complex128: torch.float64}


class Pairs:
    """A complex tensor of shape S as the real tensor `t` of shape S + [2]."""
    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor):
        self.t = t

    @property
    def re(self):
        return self.t[..., 0]

    @property
    def im(self):
        return self.t[..., 1]


def pair(re, im) -> Pairs:
    re, im = torch.broadcast_tensors(*(_tensor(x, re, im) for x in (re, im)))
    return Pairs(torch.stack([re, im], -1))


def _tensor(x, *like):
    if isinstance(x, torch.Tensor):
        return x
    ref = next(t for t in like if isinstance(t, torch.Tensor))
    return torch.full_like(ref, x)


def parts(x):
    """(real, imaginary) of a Pairs, a real tensor or a Python number."""
    if isinstance(x, Pairs):
        return x.re, x.im
    if isinstance(x, complex):
        return x.real, x.imag
    return x, 0.0


def dim(d: int) -> int:
    """A complex tensor's dim `d` in its pairs (the trailing dim of 2 comes last)."""
    return d - 1 if d < 0 else d


def real_view(t: torch.Tensor) -> torch.Tensor:
    """How a complex weight is stored: its real view, contiguous."""
    return torch.view_as_real(t).contiguous() if t.is_complex() else t


def _complex(x) -> bool:
    return isinstance(x, (Pairs, complex))


def _mul(a, b):
    if isinstance(a, Pairs) and not _complex(b):          # complex times real: one product
        return Pairs(a.t * _last(b))
    if isinstance(b, Pairs) and not _complex(a):
        return Pairs(b.t * _last(a))
    (ar, ai), (br, bi) = parts(a), parts(b)
    return pair(ar * br - ai * bi, ar * bi + ai * br)


def _last(x):
    return x.unsqueeze(-1) if isinstance(x, torch.Tensor) else x


def _div(a, b):
    if isinstance(a, Pairs) and not _complex(b):
        return Pairs(a.t / _last(b))
    (ar, ai), (br, bi) = parts(a), parts(b)
    den = br * br + bi * bi
    return pair((ar * br + ai * bi) / den, (ai * br - ar * bi) / den)


def _pow(x, n):
    """An integer power by repeated products (a general complex power is refused)."""
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 16:
        raise ExportError("the model raises a complex number to a power other than an int in "
                          "0..16", where="aten.pow.Tensor_Scalar", expected="an int exponent "
                          "0..16", found=repr(n), fix="write the power as products")
    out = pair(torch.ones_like(x.re), 0.0)
    for _ in range(n):
        out = _mul(out, x)
    return out


def _add(a, b, alpha=1, sign=1):
    (ar, ai), (br, bi) = parts(a), parts(b)
    return pair(ar + sign * alpha * br, ai + sign * alpha * bi)


def _to_copy(x, dtype=None, **kwargs):
    kwargs = {k: v for k, v in kwargs.items() if k in ("device",) and v is not None}
    if isinstance(x, Pairs):
        if dtype is None or dtype.is_complex:
            return Pairs(x.t.to(REAL.get(dtype, x.t.dtype), **kwargs))
        return x.re.to(dtype, **kwargs)        # torch drops the imaginary part
    return pair(x.to(REAL[dtype], **kwargs), 0.0)


def _to(x, *args, **kwargs):
    """Any overload of `to`: the dtype it names, if any (positional or keyword)."""
    dtype = kwargs.get("dtype") or next((a for a in args if isinstance(a, torch.dtype)), None)
    if dtype is None and any(isinstance(a, torch.Tensor) for a in args):   # to.other
        dtype = next(a for a in args if isinstance(a, torch.Tensor)).dtype
    return _to_copy(x, dtype)


def _shape(fn):
    """A shape op whose size list gains the trailing 2."""
    return lambda x, size, *a: Pairs(fn(x.t, [*size, 2], *a))


def _one_dim(fn):
    """An op whose second argument is one dim."""
    return lambda x, d, *a, **k: Pairs(fn(x.t, dim(d), *a, **k))


def _dims(fn):
    """An op whose second argument is a list of dims (or one)."""
    def call(x, ds, *a, **k):
        ds = [dim(d) for d in ds] if isinstance(ds, (list, tuple)) else dim(ds)
        return Pairs(fn(x.t, ds, *a, **k))
    return call


def _list(fn):
    """An op over a list of tensors and one dim (cat, stack)."""
    def call(xs, d=0):
        if not all(isinstance(x, Pairs) for x in xs):
            xs = [x if isinstance(x, Pairs) else pair(x, 0.0) for x in xs]
        return Pairs(fn([x.t for x in xs], dim(d)))
    return call


def _exp(x):
    mag = torch.exp(x.re)
    return pair(mag * torch.cos(x.im), mag * torch.sin(x.im))


def _where(cond, a, b):
    a, b = (x if isinstance(x, Pairs) else pair(x, 0.0) for x in (a, b))
    return Pairs(torch.where(cond.unsqueeze(-1), a.t, b.t))


HANDLERS = {
    aten.view_as_complex.default: lambda x: Pairs(x),
    aten.view_as_real.default: lambda x: x.t,
    aten.polar.default: lambda r, a: pair(r * torch.cos(a), r * torch.sin(a)),
    aten.complex.default: lambda re, im: pair(re, im),
    aten.real.default: lambda x: x.re,
    aten.imag.default: lambda x: x.im,
    aten.abs.default: lambda x: torch.sqrt(x.re * x.re + x.im * x.im),
    aten.angle.default: lambda x: torch.atan2(x.im, x.re),
    aten.conj.default: lambda x: pair(x.re, -x.im),
    aten._conj.default: lambda x: pair(x.re, -x.im),
    aten.conj_physical.default: lambda x: pair(x.re, -x.im),
    aten.resolve_conj.default: lambda x: x,
    aten.resolve_neg.default: lambda x: x,
    aten.neg.default: lambda x: Pairs(-x.t),
    aten.exp.default: _exp,
    aten.mul.Tensor: _mul, aten.mul.Scalar: _mul,
    aten.div.Tensor: _div, aten.div.Scalar: _div,
    aten.reciprocal.default: lambda x: _div(1.0, x),
    aten.pow.Tensor_Scalar: _pow,
    aten.add.Tensor: _add, aten.add.Scalar: _add,
    aten.sub.Tensor: lambda a, b, alpha=1: _add(a, b, alpha, -1),
    aten.sub.Scalar: lambda a, b, alpha=1: _add(a, b, alpha, -1),
    aten.rsub.Scalar: lambda a, b, alpha=1: _add(b, a, alpha, -1),
    aten.rsub.Tensor: lambda a, b, alpha=1: _add(b, a, alpha, -1),
    aten.where.self: _where,
    aten._to_copy.default: _to_copy,
    aten.to.dtype: _to, aten.to.dtype_layout: _to, aten.to.device: _to, aten.to.other: _to,
    aten.clone.default: lambda x, **k: Pairs(torch.clone(x.t)),
    aten.alias.default: lambda x: x,
    aten.detach.default: lambda x: x,
    aten.lift_fresh_copy.default: lambda x: Pairs(torch.clone(x.t)),
    aten.contiguous.default: lambda x, **k: Pairs(x.t.contiguous()),
    aten.view.default: _shape(torch.reshape), aten.reshape.default: _shape(torch.reshape),
    aten._unsafe_view.default: _shape(torch.reshape),
    aten.expand.default: lambda x, size, implicit=False: Pairs(x.t.expand(*size, 2)),
    aten.repeat.default: lambda x, reps: Pairs(x.t.repeat(*reps, 1)),
    aten.permute.default: lambda x, ds: Pairs(x.t.permute(*[dim(d) for d in ds], -1)),
    aten.transpose.int: lambda x, a, b: Pairs(x.t.transpose(dim(a), dim(b))),
    aten.t.default: lambda x: Pairs(x.t.transpose(0, 1)),
    aten.unsqueeze.default: _one_dim(torch.unsqueeze),
    aten.squeeze.dim: _one_dim(torch.squeeze),
    aten.squeeze.dims: _dims(torch.squeeze),
    aten.select.int: _one_dim(torch.select),
    aten.slice.Tensor: lambda x, d=0, *a: Pairs(aten.slice.Tensor(x.t, dim(d), *a)),
    aten.narrow.default: _one_dim(torch.narrow),
    aten.index_select.default: _one_dim(torch.index_select),
    aten.flatten.using_ints: lambda x, a=0, b=-1: Pairs(x.t.flatten(dim(a), dim(b))),
    aten.unflatten.int: lambda x, d, sizes: Pairs(x.t.unflatten(dim(d), sizes)),
    aten.index.Tensor: lambda x, idx: Pairs(aten.index.Tensor(x.t, idx)),
    aten.sum.dim_IntList: _dims(torch.sum),
    aten.cat.default: _list(torch.cat),
    aten.stack.default: _list(torch.stack),
    aten.split.Tensor: lambda x, s, d=0: [Pairs(p) for p in torch.split(x.t, s, dim(d))],
    aten.split_with_sizes.default:
        lambda x, s, d=0: [Pairs(p) for p in torch.split(x.t, s, dim(d))],
    aten.chunk.default: lambda x, n, d=0: [Pairs(p) for p in torch.chunk(x.t, n, dim(d))],
    aten._assert_tensor_metadata.default: lambda *a, **k: None,
}
# ops that make a complex value from real ones
CREATES = {aten.view_as_complex.default, aten.polar.default, aten.complex.default}


def _has_pairs(values) -> bool:
    return any(isinstance(v, Pairs) or (isinstance(v, (list, tuple)) and _has_pairs(v))
               for v in values)


def involved(target, args, kwargs) -> bool:
    """Whether a call takes or makes a complex value."""
    if target in CREATES or _has_pairs(args) or _has_pairs(kwargs.values()):
        return True
    if any(isinstance(a, complex) for a in args) and target in HANDLERS:   # x * 1j
        return True
    return target is aten._to_copy.default and getattr(kwargs.get("dtype"), "is_complex",
                                                       False)


def call(target, args, kwargs):
    """The call, computed on pairs."""
    fn = HANDLERS.get(target)
    if fn is None:
        raise ExportError(f"the model computes with complex numbers through {target}, which "
                          "aotc does not compute", where=str(target),
                          expected="complex ops aotc computes as (real, imaginary) pairs: "
                          + ", ".join(sorted(str(t) for t in HANDLERS)[:12]) + ", ...",
                          found=str(target), fix="write this step with real tensors (e.g. "
                          "rotary embeddings with cos and sin), or report the op to aotc")
    return fn(*args, **kwargs)


def made(target, value):
    """`value`, which `target` computed from real values; an op aotc does not carry as pairs
    that makes a complex tensor (an FFT, a complex constant) is an ExportError."""
    if isinstance(value, torch.Tensor) and value.is_complex():
        raise ExportError(f"the model makes a complex tensor with {target}, which aotc does "
                          "not compute", where=str(target), expected="complex values made "
                          "by view_as_complex, polar, complex, a cast or an FFT",
                          found=f"{target} -> {value.dtype}", fix="write this step with real "
                          "tensors, or report the op to aotc")
    return value


def refuse(value, what: str, where: str):
    """An ExportError for a complex value where artifacts hold none (an input or output)."""
    if isinstance(value, Pairs) or (isinstance(value, torch.Tensor) and value.is_complex()):
        raise ExportError(f"the model's {what} is complex, which artifacts do not hold",
                          where=where, expected="real tensors", found="a complex tensor",
                          fix=f"pass the {what} as torch.view_as_real(...) (its real and "
                              "imaginary parts in a trailing dim of 2)")


# Fourier transforms (exporter/fft.py, exporter/stft.py): they make complex values from real ones
from aotc.exporter import fft as _fft, stft as _stft  # noqa: E402 - they build on the pairs above

HANDLERS.update(_fft.HANDLERS)
HANDLERS.update(_stft.HANDLERS)
CREATES |= set(_fft.HANDLERS) | {aten.stft.default, aten.stft.center}
