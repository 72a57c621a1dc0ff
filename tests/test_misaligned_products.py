"""Products on CUDA targets whose output rows would not be 16-byte aligned (GPT-2's tied LM
head: 50257 bf16 logits a row) run transposed, w^T @ x^T, into aligned rows
(codegen/lowering/matvec.py), and the kernel that stores the result in eager's layout reads
it in 2-d tiles (codegen/triton/blocks.py); run here by Triton's interpreter against eager."""
from __future__ import annotations

import json

import pytest
import torch

import aotc
from aotc.api import compile_function

pytest.importorskip("triton")
CUDA = {"target": "cuda:sm_90"}


def _plan(path):
    m = aotc.load(path, device="cpu", interpret=True)
    return m, m.entries["forward"].plan


def _extern_out_shapes(plan, op="aten::mm.default"):
    return [list(plan.slots[s.out[0]].shape) for s in plan.steps
            if s.kind.value == "extern" and s.op == op]


@pytest.mark.parametrize("n, transposed", [(1001, True), (1000, False)])
def test_products_with_misaligned_rows_run_transposed(tmp_path, n, transposed):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(n, 64, generator=g).to(torch.bfloat16)
    fn = lambda x, w: x @ w.t()   # noqa: E731
    path = compile_function(fn, (x, w), tmp_path / "m.aotc", **CUDA)
    m, plan = _plan(path)
    assert _extern_out_shapes(plan) == ([[n, 32]] if transposed else [[32, n]])
    got = m(x, w)
    assert got.is_contiguous()     # graph outputs keep eager's layout
    torch.testing.assert_close(got, fn(x, w), rtol=1.6e-2, atol=1e-2)
    if transposed:   # the copy back to eager's layout: 2-d tiles, not rows of 1024
        kernels = [s.name for s in plan.steps if s.kind.value == "kernel"]
        assert len(kernels) == 1
        spec = json.loads((path / "kernels" / f"{kernels[0]}.json").read_text())
        assert spec["constexprs"]["XBLOCK"] == 32 and spec["constexprs"]["R0_BLOCK"] == 32


def test_fp32_products_are_left_alone(tmp_path):
    x, w = torch.randn(32, 64), torch.randn(1001, 64)
    _, plan = _plan(compile_function(lambda x, w: x @ w.t(), (x, w), tmp_path / "a.aotc", **CUDA))
    assert _extern_out_shapes(plan) == [[32, 1001]]


def test_gpt2_tied_lm_head_matches_eager(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=1001, n_layer=1, n_embd=64, n_head=2,
                                  n_positions=64, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 1001, (2, 16))
    path = aotc.export(model, (ids,), tmp_path / "g.aotc", **CUDA)
    m, plan = _plan(path)
    assert _extern_out_shapes(plan) == [[1001, 32]]
    with torch.no_grad():
        want = model(ids).logits
    got = m(ids)["logits"]
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
