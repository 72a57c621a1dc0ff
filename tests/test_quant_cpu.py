"""Quantized products on CPUs (codegen/cpp/quant_mm.py): int8 and int4 (groups of 32, 64, 128)
weights times 1 to 50 rows of x, in the C++ kernel every level's library carries, against a
float64 product of the dequantized weights, at every level this host runs; and a tiny LLaMA
generator whose greedy tokens are the eager model's computing with the same weights."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import aotc
from aotc.artifact.isa import supported
from aotc.artifact.quant import dequantize_int4
from aotc.codegen.cpp.quant_mm import PANEL_MIN_ROWS
from conftest import llama_sample, slot0_logits_by_bucket

# (rows, K, N, bias): one row to the panels' rows, odd N, int8's K not a multiple of 16
INT4_SHAPES = [(1, 128, 37, True), (3, 256, 64, False), (8, 128, 33, True),
               (17, 256, 50, True), (PANEL_MIN_ROWS + 2, 128, 70, False),
               (PANEL_MIN_ROWS + 5, 256, 19, True)]
INT8_SHAPES = INT4_SHAPES + [(3, 70, 21, True), (PANEL_MIN_ROWS + 1, 70, 21, True)]


class Layers(torch.nn.Module):
    """One linear layer per shape, each applied to its own input."""

    def __init__(self, shapes):
        super().__init__()
        torch.manual_seed(0)
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(k, n, bias=b) for _, k, n, b in shapes)

    def forward(self, *xs):
        return tuple(fc(x) for fc, x in zip(self.fcs, xs))


def _weight(sd, i) -> torch.Tensor:
    """Layer i's weight as the artifact stores it, dequantized, in float64."""
    key = f"fcs.{i}.weight"
    if key + "_int4" in sd:
        return dequantize_int4(sd[key + "_int4"], sd[key + "_scale"]).double()
    return sd[key + "_int8"].double() * sd[key + "_scale"].double()[:, None]


@pytest.mark.parametrize("scheme,group", [("int8", None), ("int4", 32), ("int4", 64),
                                          ("int4", 128)])
def test_products_match_a_float64_reference_at_every_level(tmp_path, scheme, group):
    shapes = INT8_SHAPES if scheme == "int8" else INT4_SHAPES
    model = Layers(shapes).eval()
    gen = torch.Generator().manual_seed(1)
    xs = tuple(torch.randn(m, k, generator=gen) for m, k, _, _ in shapes)
    path = aotc.export(model, xs, tmp_path / "q.aotc", quantize=scheme,
                       **({"group_size": group} if group else {}))
    source = (path / "kernels/kernels.cpp").read_text()
    assert source.count("dequantized in registers") >= 1 and "panels dequantized once" in source
    plan = json.loads((path / "plans/forward.json").read_bytes())
    assert not [s for s in plan["steps"] if s.get("op") in ("aten::mm.default",
                                                            "aten::addmm.default")]
    assert not [s for s in plan["slots"] if s.get("dtype") == "float32" and s.get("producer")
                and len(s["shape"]) == 2 and tuple(s["shape"]) in {(n, k) for _, k, n, _ in
                                                                   shapes}]  # no float copy
    levels = [lv for lv in aotc.load(path).manifest.target.native.levels if supported(lv)]
    assert len(levels) >= 2 or len(levels) == len(aotc.load(path).manifest.target.native.levels)
    for level in levels:
        m = aotc.load(path, isa=level)
        sd = m.state_dict()
        for i, (x, y) in enumerate(zip(xs, m(*xs))):
            want = F.linear(x.double(), _weight(sd, i),
                            sd[f"fcs.{i}.bias"].double() if f"fcs.{i}.bias" in sd else None)
            err = float((y.double() - want).abs().max() / want.abs().max())
            assert err < 1e-5, (level, shapes[i], err)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_tiny_llama_generator_tokens_are_the_eager_quantized_models(tmp_path, scheme):
    """samples/llama.py for decoding, every projection and the LM head quantized: prefill (a
    prompt's length is a size symbol: 8 rows take the rows path, 50 the panels) and decode
    (1 row) run the C++ kernel, and the greedy tokens equal the eager model's computing with
    the same dequantized weights."""
    from aotc.exporter.generate import Generator, adapt, eager_generate
    from aotc.exporter.quantize import quantized, select
    from aotc.options import ExportOptions
    model = llama_sample()
    ids = torch.randint(0, 500, (1, 8), generator=torch.Generator().manual_seed(2))
    group = 32 if scheme == "int4" else None
    opts = dict(decode=True, max_cache_len=64, quantize=scheme, quantize_lm_head=True,
                **({"group_size": group} if group else {}))
    path = aotc.export(model, (ids,), tmp_path / "g.aotc", **opts)
    assert "aotc_dot_columns" in (path / "kernels/kernels.cpp").read_text()
    art = aotc.load(path)
    assert any(k.startswith("output") for k in art.manifest.quantization.layers)
    long = torch.randint(0, 500, (1, 50), generator=torch.Generator().manual_seed(3))
    with quantized(model, select(model, ExportOptions(**opts)), scheme, group):
        want = [eager_generate(Generator(adapt(model, 1, 64), 64), p, 12) for p in (ids, long)]
    assert torch.equal(art.generate(ids, 12), want[0])
    assert torch.equal(art.generate(long, 12), want[1])
    python = aotc.load(path, runner="python")    # the other front end, the same kernels
    assert torch.equal(python.generate(long, 12), want[1])


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_quantized_slot_decodes_bitwise_alike_in_every_bucket(tmp_path, scheme):
    """A generator with slots, every projection and the LM head quantized: slot 0's logits
    from the 1-slot bucket (one row through the kernel's four-weight-rows path) equal those
    of the 4-slot decode (four rows, one weight row at a time) exactly, so a request's tokens
    do not depend on how many others a step decodes."""
    model = llama_sample()
    ids = torch.randint(0, 500, (1, 6), generator=torch.Generator().manual_seed(0))
    opts = {"group_size": 32} if scheme == "int4" else {}
    path = aotc.export(model, (ids,), tmp_path / "s.aotc", decode=True, max_cache_len=32,
                       max_batch=4, slot_buckets="1", quantize=scheme, quantize_lm_head=True,
                       **opts)
    one, four = slot0_logits_by_bucket(path)
    assert torch.equal(one, four)
