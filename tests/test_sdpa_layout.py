"""SDPA outputs on the CPU are planned where the machine's attention kernel puts them: CPU
flash attention answers in its query's memory order, (batch, seq, heads, dim) for the usual
`qkv(x).view(b, t, h, d).transpose(1, 2)`, so the plan records those strides instead of
assuming a contiguous (batch, heads, seq, dim) output (which cost a copy at every call), and
the kernel that gathers the heads reads it in place. A runtime whose SDPA answers otherwise
gets a copy, never a wrong read."""
import json

import torch
from torch import nn

import aotc
from aotc.runtime import executor


class Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(d, dim=-1))
        o = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, t, d))


def _sdpa_slot(path):
    plan = json.loads((path / "plans/forward.json").read_text())
    step, = [s for s in plan["steps"] if "scaled_dot_product" in s.get("op", "")]
    return plan["slots"][step["out"][0]]


def test_sdpa_output_slot_has_the_kernels_layout_and_matches_eager(tmp_path):
    model = Attention().eval()
    x = torch.randn(2, 16, 64)
    path = aotc.export(model, (x,), tmp_path / "a.aotc")
    slot = _sdpa_slot(path)
    assert slot["shape"] == [2, 4, 16, 16] and slot["stride"] == [1024, 16, 64, 1]
    assert slot["contiguous"] is False
    m = aotc.load(path)
    assert "layout(v{0}, (1024, 16, 64, 1), False, (2, 4, 16, 16),".format(slot["id"]) in m.code
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), rtol=1e-5, atol=1e-5)


def test_contiguous_queries_give_a_contiguous_output_slot(tmp_path):
    class Plain(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v) * 2
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    path = aotc.export(Plain(), (q, k, v), tmp_path / "p.aotc")
    assert _sdpa_slot(path)["stride"] == [512, 128, 16, 1]
    torch.testing.assert_close(aotc.load(path)(q, k, v), Plain()(q, k, v))


def test_an_sdpa_answering_in_another_layout_is_copied_not_misread(tmp_path, monkeypatch):
    model = Attention().eval()
    x = torch.randn(2, 16, 64)
    path = aotc.export(model, (x,), tmp_path / "a.aotc")
    sdpa, resolve = torch.ops.aten.scaled_dot_product_attention.default, executor.resolve_op
    answered = []

    def contiguous_sdpa(*args, **kwargs):
        out = sdpa(*args, **kwargs).contiguous()
        answered.append(out.stride())
        return out
    monkeypatch.setattr(executor, "resolve_op", lambda name: contiguous_sdpa
                        if "scaled_dot_product" in name else resolve(name))
    m = aotc.load(path, runner="python")   # ops substituted in Python: the Python runner's
    with torch.no_grad():                   # (the C++ runner's copies: test_cpp_runner.py)
        torch.testing.assert_close(m(x), model(x), rtol=1e-5, atol=1e-5)
    assert answered == [(1024, 256, 16, 1)]
