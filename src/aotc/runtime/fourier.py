"""aotc::fft, aotc's Fourier transform op: what export writes for torch.fft's transforms
(exporter/fft.py) and both runners run with torch.fft (runtime/cpp/aotc_ops.cpp the same).

`fft(x, dims, mode, size=0)` transforms the dims set in the bitmask `dims` of x, which is real
or, with mode bit 4, complex as pairs (a trailing dim of 2: artifacts hold no complex dtype,
exporter/complex.py). Mode bit 1 is the inverse, bit 2 one-sided, bits 8 and 16 the norm
(backward, forward, ortho), bits 32 and up the one-sided dim:
- neither 1 nor 2: fftn (real or pairs in, pairs out);  1: ifftn (the same);
- 2: rfftn (real in, pairs out, the one-sided dim halved to n // 2 + 1);
- 1 and 2: irfftn (pairs in, real out, the one-sided dim `size` long, 2 (m - 1) for 0, at most
  2 m: longer would pad with zeros a hostile plan could make any length).
16-bit floats are computed in float32 (eager has no CPU FFT for them) and returned in their
dtype. Arguments a transform cannot take are an ArtifactError naming them.
"""
from __future__ import annotations

import torch

NORMS = ("backward", "forward", "ortho")
_HALF = (torch.float16, torch.bfloat16)


def fft_mode(*, inverse: bool, onesided: bool, pairs: bool, norm: str, last: int = 0) -> int:
    """The `mode` argument (see the module doc)."""
    return (int(inverse) | int(onesided) << 1 | int(pairs) << 2 | NORMS.index(norm) << 3
            | last << 5)


def fft_dims(x, dims: int, mode: int, size: int = 0) -> tuple[list[int], int]:
    """The transformed dims in the order torch.fft takes them (the one-sided dim last), and
    the one-sided dim's output length for irfftn (0 otherwise), after checking the arguments
    against x."""
    pairs, norm, last = mode >> 2 & 1, mode >> 3 & 3, mode >> 5
    nd = x.dim() - pairs
    out = [d for d in range(max(nd, 0)) if dims >> d & 1]
    kind = mode & 3
    bins = x.shape[last] if kind == 3 and 0 <= last < nd else 0
    n = (size or 2 * (bins - 1)) if kind == 3 else size
    bad = (dims <= 0 or mode < 0 or size < 0 or nd < 1 or dims >> nd or norm > 2
           or (pairs and (x.shape[-1] != 2 or not x.is_floating_point()))
           or (kind >= 2 and last not in out) or (kind < 2 and last)
           or (kind == 2 and pairs) or (kind == 3 and (not pairs or not 1 <= n <= 2 * bins))
           or (kind != 3 and size))
    if bad:
        from aotc.errors import ArtifactError
        raise ArtifactError("the plan calls aotc::fft with dims or a mode its input cannot take",
                            where="aotc::fft", expected=f"dims among the {nd} of the input, a "
                            "mode fft_mode makes and a size only for irfftn (1 to 2x its bins)",
                            found=f"dims {dims}, mode {mode}, size {size}",
                            fix="re-export the model")
    return ([d for d in out if d != last] + [last] if kind >= 2 else out), n


def fft(x, dims, mode, size=0):
    order, n = fft_dims(x, dims, mode, size)
    work = x.float() if x.dtype in _HALF else x
    z = torch.view_as_complex(work.contiguous()) if mode & 4 else work
    norm, kind = NORMS[mode >> 3 & 3], mode & 3
    if kind == 3:
        out = torch.fft.irfftn(z, s=[z.shape[d] for d in order[:-1]] + [n], dim=order,
                               norm=norm)
    else:
        f = (torch.fft.fftn, torch.fft.ifftn, torch.fft.rfftn)[kind]
        out = torch.view_as_real(f(z, dim=order, norm=norm))
    return out.to(x.dtype) if x.dtype in _HALF else out


def fft_shape(x, dims: int, mode: int, size: int = 0) -> tuple[list[int], torch.dtype]:
    """The result's shape and dtype (export's fake implementation, aotc/nn.py)."""
    order, n = fft_dims(x, dims, mode, size)
    shape = list(x.shape[:-1] if mode & 4 else x.shape)
    if mode & 3 == 2:
        shape[order[-1]] = shape[order[-1]] // 2 + 1
    if mode & 3 == 3:
        shape[order[-1]] = n
    dtype = x.dtype if x.is_floating_point() else torch.float32
    return shape if mode & 3 == 3 else shape + [2], dtype
