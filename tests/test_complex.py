"""Complex numbers in models (exporter/complex.py): rotary embeddings written with complex
multiplication (LLaMA's reference code, torchtitan, DeepSeek-V2, Llama 4) export as real
arithmetic on (real, imaginary) pairs, with a complex buffer stored as its real view; every
complex op of the table against eager; complex inputs, outputs and ops outside the table are
ExportErrors that name them. Also: an in-place op a C++ composite leaves below
functionalization (nn.RMSNorm without a weight) is made functional."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import aotc
from aotc.errors import ExportError


def freqs_cis(dim: int, length: int) -> torch.Tensor:
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    angles = torch.outer(torch.arange(length).float(), inv)
    return torch.polar(torch.ones_like(angles), angles)          # complex64 [length, dim / 2]


class ComplexRope(nn.Module):
    """torchtitan's shape: a complex buffer, queries rotated by complex products."""

    def __init__(self, dim=16, heads=2, length=64):
        super().__init__()
        self.proj = nn.Linear(dim * heads, dim * heads)
        self.heads, self.dim = heads, dim
        self.register_buffer("freqs_cis", freqs_cis(dim, length))

    def forward(self, x):                                          # x [B, T, heads * dim]
        b, t, _ = x.shape
        q = self.proj(x).view(b, t, self.heads, self.dim)
        qc = torch.view_as_complex(q.float().reshape(b, t, self.heads, -1, 2))
        rot = qc * self.freqs_cis[:t].view(1, t, 1, -1)
        return torch.view_as_real(rot).flatten(3).type_as(x)


class RuntimeRope(nn.Module):
    """DeepSeek-V2's shape: the complex table computed in forward with polar."""

    def forward(self, x, pos):                                     # x [B, T, D], pos [T]
        inv = 1.0 / 10000 ** (torch.arange(0, x.shape[-1], 2, dtype=torch.float32)
                              / x.shape[-1])
        table = torch.polar(torch.ones(pos.shape[0], inv.shape[0]), pos[:, None].float() * inv)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * table).flatten(2)


class EveryOp(nn.Module):
    """Each complex op of the table once, on pairs made from the input."""

    def forward(self, x):                                          # x [4, 6, 2]
        z = torch.view_as_complex(x)                                # [4, 6]
        w = torch.complex(x[..., 1], x[..., 0] + 1.5)
        y = z * w + z / w - 2.0 * z + z * (0.5 + 1j) - w.conj() * 3
        y = torch.cat([y, torch.exp(y * 0.1)], 0).transpose(0, 1)   # [6, 8]
        y = y.unsqueeze(0).expand(2, 6, 8).permute(2, 0, 1)[1:5].select(1, 1)   # [4, 6]
        y = y + y.abs() + y.angle() + torch.where(x[..., 0] > 0, y, -y)
        y = y.to(torch.complex128).to(torch.complex64).sum(1, keepdim=True)
        return torch.view_as_real(y), y.real, y.imag


class Mixed(nn.Module):
    """Complex with real tensors and numbers on either side, broadcast both ways."""

    def forward(self, x, r):                                       # x [6, 2], r [3, 6]
        z = torch.view_as_complex(x)                               # [6]
        y = r * 1j + 2.0 / z + z / r + r * z - (1 - 2j) * z + z.unsqueeze(0) * z[:1]
        y = y + z ** 3 + (1 - z)
        return torch.view_as_real(y / (1 + 0.5j))                   # [3, 6, 2]


@pytest.mark.parametrize("model,args", [
    (ComplexRope(), (torch.randn(2, 10, 32),)),
    (RuntimeRope(), (torch.randn(2, 10, 16), torch.arange(10))),
    (EveryOp(), (torch.randn(4, 6, 2),)),
    (Mixed(), (torch.randn(6, 2), torch.randn(3, 6) + 3))],
    ids=["buffer", "polar", "every-op", "mixed"])
def test_complex_arithmetic_exports_as_real_pairs(tmp_path, model, args):
    torch.manual_seed(0)
    path = aotc.export(model, args, tmp_path / "c.aotc")
    want = model(*args)
    got = aotc.load(path)(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert not g.is_complex()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_a_complex_buffer_is_stored_as_its_real_view(tmp_path):
    from safetensors import safe_open
    path = aotc.export(ComplexRope(), (torch.randn(1, 4, 32),), tmp_path / "c.aotc")
    with safe_open(str(path / "weights.safetensors"), "pt") as f:
        table = f.get_tensor("freqs_cis")
    assert table.dtype == torch.float32 and table.shape == (64, 8, 2)


def test_a_dynamic_length_with_a_complex_table(tmp_path):
    x = torch.randn(2, 10, 32)
    seq = torch.export.Dim("seq", min=2, max=64)
    m = ComplexRope()
    path = aotc.export(m, (x,), tmp_path / "c.aotc", dynamic_shapes={"x": {1: seq}})
    loaded = aotc.load(path)
    for t in (3, 17):
        x = torch.randn(2, t, 32)
        torch.testing.assert_close(loaded(x), m(x), rtol=1e-5, atol=1e-5)


class ComplexOut(nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x) * 2


class ComplexLog(nn.Module):   # the logarithm of a spectrum: not computed as pairs
    def forward(self, x):
        return torch.view_as_real(torch.log(torch.fft.rfft(x)))


class ComplexOpOutsideTable(nn.Module):
    def forward(self, x):
        return torch.view_as_real(torch.view_as_complex(x).sqrt())


@pytest.mark.parametrize("model,x,message", [
    (ComplexOut(), torch.randn(3, 2), "the model's output is complex"),
    (ComplexLog(), torch.randn(8),
     "the model computes with complex numbers through aten.log"),
    (ComplexOpOutsideTable(), torch.randn(3, 2),
     "the model computes with complex numbers through aten.sqrt")])
def test_complex_values_aotc_does_not_compute_are_refused(tmp_path, model, x, message):
    with pytest.raises(ExportError, match=message.replace("(", r"\(")) as e:
        aotc.export(model, (x,), tmp_path / "c.aotc")
    assert e.value.fix and not (tmp_path / "c.aotc").exists()
    assert "While executing" not in str(e.value)   # torch.fx's notes; aotc says where itself
    if isinstance(model, ComplexOpOutsideTable):   # the model's own line
        assert "test_complex.py:" in e.value.where and ".sqrt()" in e.value.where


def test_rms_norm_without_a_weight_is_functional(tmp_path):
    """torch's C++ rms_norm, decomposed below functionalization, leaves `mean(...).add_(eps)`:
    the plan would call an in-place op (refused as unknown to the runtime) without the pass."""
    m = nn.Sequential(nn.Linear(16, 16), nn.RMSNorm(16, eps=1e-5, elementwise_affine=False))
    x = torch.randn(3, 16)
    path = aotc.export(m, (x,), tmp_path / "r.aotc")
    torch.testing.assert_close(aotc.load(path)(x), m(x), rtol=1e-5, atol=1e-5)
