"""Attention in training artifacts stays fused (exporter/train_attention.py): the forward
calls ATen's scaled_dot_product_attention and the backward aotc::sdpa_backward, which
recomputes the forward under autograd (runtime/attention.py), so no [T, K] attention weights
are computed or saved. Gradients against eager in float64, through both plan runners, for the
forms models call (plain, causal, a boolean mask, grouped-query heads)."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import aotc
from aotc.runtime.cpp_runner import runner_status


class Attention(nn.Module):
    def __init__(self, d=32, heads=4, kv_heads=4, causal=False, masked=False, dropout=0.0):
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * kv_heads * self.head)
        self.proj = nn.Linear(d, d)
        self.causal, self.masked, self.dropout = causal, masked, dropout

    def forward(self, x):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, self.head).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head).permute(2, 0, 3, 1, 4)
        mask = None
        if self.masked:   # a band: each query sees itself and the 3 keys before it
            i = torch.arange(t)
            mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 4)
        a = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal, dropout_p=self.dropout,
            enable_gqa=self.heads != self.kv_heads)
        return self.proj(a.transpose(1, 2).reshape(b, t, d))


FORMS = {"plain": {}, "causal": {"causal": True}, "masked": {"masked": True},
         "gqa": {"heads": 4, "kv_heads": 2, "causal": True}}


def _ops(path, entry):
    plan = json.loads((path / "plans" / f"{entry}.json").read_text())
    return [s["op"] for s in plan["steps"] if "op" in s]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = {}
    for name, form in FORMS.items():
        torch.manual_seed(0)
        model = Attention(**form).double()
        x = torch.randn(2, 8, 32, dtype=torch.float64)
        path = tmp_path_factory.mktemp(name) / "t.aotc"
        aotc.export(model, (x,), path, train=True)
        out[name] = (path, model, x)
    return out


@pytest.mark.parametrize("name", list(FORMS))
def test_attention_stays_fused_in_both_graphs(exported, name):
    path = exported[name][0]
    forward, backward = _ops(path, "forward"), _ops(path, "backward")
    assert "aten::scaled_dot_product_attention.default" in forward
    assert backward.count("aotc::sdpa_backward.default") == 1
    # no attention weights: the only products left are the projections' (mm / addmm)
    assert not any(op in ("aten::bmm.default", "aten::_softmax.default") for op in backward)


RUNNERS = ["python"] + (["cpp"] if runner_status()[0] is not None else [])


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("name", list(FORMS))
def test_gradients_match_eager_in_float64(exported, name, runner):
    path, model, x = exported[name]
    m = aotc.load(path, runner=runner)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    w = torch.randn(2, 8, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (m(xa) * w).sum().backward()
    (model(xb) * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-9, atol=1e-11)
    for (n, a), (_, b) in zip(m.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-11, msg=lambda s: f"{n}: {s}")
    model.zero_grad()


def test_dropout_keeps_the_math_path(tmp_path):
    """A call with dropout is not the fused op's to take: its math form, randomness included."""
    model = Attention(dropout=0.5)
    aotc.export(model, (torch.randn(2, 8, 32),), tmp_path / "t.aotc", train=True)
    assert "aotc::sdpa_backward.default" not in _ops(tmp_path / "t.aotc", "backward")
