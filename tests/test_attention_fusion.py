"""Hand-written attention becomes one SDPA call in CPU inference (codegen/attention_fusion.py
`fuse_manual_attention`): `softmax(q @ k^T / c [+ mask]) @ v` on (batch, heads, seq, dim)
tensors, an additive mask becoming `attn_mask` and nanoGPT's `masked_fill(m, -inf)` a boolean
`attn_mask` (not m). Attention probabilities used elsewhere, fills other than -inf and training
graphs keep their matmuls. Every variant matches eager."""
import json
import math

import pytest
import torch
from torch import nn

import aotc
from aotc.cli.report import inspect_text
from aotc.codegen.attention_fusion import MIN_KEYS, fuse_manual_attention
from aotc.exporter.loader import load_model

REWRITE = "hand-written attention -> scaled_dot_product_attention"
SEQ = MIN_KEYS    # the shortest key length fused


class Attn(nn.Module):
    """q, k, v projections of x; `variant` picks the scores' form."""
    def __init__(self, variant: str = "div", dim: int = 32, heads: int = 4):
        super().__init__()
        self.variant, self.heads = variant, heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.register_buffer("tril", torch.tril(torch.ones(SEQ, SEQ)).view(1, 1, SEQ, SEQ))

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(d, dim=-1))
        s = q @ k.transpose(-2, -1)
        if self.variant == "div":
            s = s / math.sqrt(d // self.heads)
        elif self.variant == "mul":
            s = s * 0.25
        if mask is not None:
            s = s + mask
        if self.variant == "causal_fill":   # nanoGPT's form: a buffer compared, -inf filled
            s = s.masked_fill(self.tril[:, :, :t, :t] == 0, float("-inf"))
        if self.variant == "finite_fill":
            s = s.masked_fill(self.tril[:, :, :t, :t] == 0, -1e4)
        p = torch.softmax(s, dim=-1)
        o = (p @ v).transpose(1, 2).reshape(b, t, d)
        if self.variant == "probs":
            return self.out(o), p
        return self.out(o)


def _stats(path):
    return json.loads((path / "manifest.json").read_text())["entries"]["forward"]["stats"]


def _check(model, args, path, fused: int):
    model.eval()
    p = aotc.export(model, args, path)
    st = _stats(p)
    assert st.get("rewrites", {}).get(REWRITE, 0) == fused
    assert ("aten::bmm.default" in st["fallback"]) == (fused == 0)
    m = aotc.load(p)
    with torch.no_grad():
        want, got = model(*args), m(*args)
    for w, g in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    return p


def test_the_transformer_sample_runs_sdpa(tmp_path):
    model = load_model("samples/transformer.py:Net")
    p = _check(model, (torch.randn(1, SEQ, 128),), tmp_path / "t.aotc", fused=2)
    text = inspect_text(p)
    assert f"rewrites: {REWRITE} x2" in text


@pytest.mark.parametrize("variant", ["div", "mul", "none"])
def test_scale_variants(tmp_path, variant):
    _check(Attn(variant), (torch.randn(2, SEQ, 32),), tmp_path / "a.aotc", fused=1)


def test_an_additive_mask_becomes_attn_mask(tmp_path):
    mask = torch.randn(2, 1, SEQ, SEQ)
    p = _check(Attn("div"), (torch.randn(2, SEQ, 32), mask), tmp_path / "m.aotc", fused=1)
    plan = json.loads((p / "plans/forward.json").read_text())
    sdpa, = [s for s in plan["steps"] if "scaled_dot_product" in s.get("op", "")]
    assert isinstance(sdpa["args"][3], dict)


def test_a_boolean_masked_fill_becomes_a_boolean_attn_mask(tmp_path):
    p = _check(Attn("causal_fill"), (torch.randn(2, SEQ, 32),), tmp_path / "c.aotc", fused=1)
    plan = json.loads((p / "plans/forward.json").read_text())
    sdpa, = [s for s in plan["steps"] if "scaled_dot_product" in s.get("op", "")]
    mask = plan["slots"][sdpa["args"][3]["slot"]]
    assert mask["dtype"] == "bool" and mask["shape"] == [1, 1, SEQ, SEQ]
    assert "aten::where.self" not in _stats(p)["lowered"]


@pytest.mark.parametrize("variant", ["probs", "finite_fill"])
def test_other_forms_keep_their_matmuls(tmp_path, variant):
    _check(Attn(variant), (torch.randn(2, SEQ, 32),), tmp_path / "n.aotc", fused=0)


def test_the_graph_given_is_not_changed():
    from aotc import exporter
    from aotc.api import ExportOptions
    prog = exporter.export(Attn("div").eval(), (torch.randn(2, SEQ, 32),),
                           ExportOptions.from_kwargs())
    before = json.dumps(prog.graph, sort_keys=True)
    graph, fused = fuse_manual_attention(prog.graph)
    assert fused == 1 and json.dumps(prog.graph, sort_keys=True) == before
    assert not any(n["op"] == "aten::bmm.default" for n in graph["nodes"])
    assert len(graph["nodes"]) < len(prog.graph["nodes"])


def test_training_keeps_the_matmuls(tmp_path):
    model = Attn("div").train()
    p = aotc.export(model, (torch.randn(2, SEQ, 32),), tmp_path / "tr.aotc", train=True)
    assert "rewrites" not in _stats(p)


def test_short_sequences_keep_their_matmuls_dynamic_ones_are_fused(tmp_path):
    """Below MIN_KEYS keys the fused softmax between two matmuls is as fast (measured); a
    dynamic key length is fused, and every length in its range matches eager."""
    from torch.export import Dim
    _check(Attn("div"), (torch.randn(2, MIN_KEYS // 2, 32),), tmp_path / "s.aotc", fused=0)
    model = Attn("div").eval()
    p = aotc.export(model, (torch.randn(2, 24, 32),), tmp_path / "d.aotc",
                    dynamic_shapes=({1: Dim("seq", min=2, max=MIN_KEYS)},))
    assert _stats(p)["rewrites"] == {REWRITE: 1}
    m = aotc.load(p)
    with torch.no_grad():
        for t in (2, 7, MIN_KEYS):
            x = torch.randn(2, t, 32)
            torch.testing.assert_close(m(x), model(x), rtol=1e-5, atol=1e-5)
