"""Products of one row on CUDA targets are fused reductions (codegen/lowering/matvec.py), run
here by Triton's interpreter against eager; more rows, and CPU targets, keep vendor GEMMs."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.api import compile_function

pytest.importorskip("triton")
CUDA = {"target": "cuda:sm_90"}


def _ops(path):
    plan = aotc.load(path, device="cpu", interpret=True).entries["forward"].plan
    return [s.op for s in plan.steps if s.kind.value == "extern"], plan


@pytest.mark.parametrize("case", ["mm", "addmm", "gate_up", "conv1d"])
def test_one_row_products_are_fused_reductions(tmp_path, case):
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = torch.randn(1, 96, generator=g), torch.randn(80, 96, generator=g), \
        torch.randn(80, 96, generator=g)
    b, wt = torch.randn(80, generator=g), torch.randn(96, 80, generator=g)
    fns = {"mm": lambda x, w1, w2, b, wt: x @ w1.t(),
           "addmm": lambda x, w1, w2, b, wt: torch.addmm(b, x, w1.t()) * 2,
           "gate_up": lambda x, w1, w2, b, wt: torch.nn.functional.silu(x @ w1.t()) * (x @ w2.t()),
           "conv1d": lambda x, w1, w2, b, wt: torch.addmm(b, x, wt)}   # GPT-2's layout
    fn = fns[case]
    path = compile_function(fn, (x, w1, w2, b, wt), tmp_path / "m.aotc", **CUDA)
    ops, plan = _ops(path)
    assert not any("mm" in op for op in ops), ops
    m = aotc.load(path, device="cpu", interpret=True)
    torch.testing.assert_close(m(x, w1, w2, b, wt), fn(x, w1, w2, b, wt), rtol=1e-4, atol=1e-4)
    if case == "gate_up":   # both products and the SiLU product in one kernel, x read once
        kernels = [s for s in plan.steps if s.kind.value == "kernel"]
        assert len(kernels) == 1, [k.reasons for k in kernels]


def test_more_rows_and_cpu_targets_keep_gemms(tmp_path):
    x, w = torch.randn(4, 32), torch.randn(16, 32)
    ops, _ = _ops(compile_function(lambda x, w: x @ w.t(), (x, w), tmp_path / "a.aotc", **CUDA))
    assert "aten::mm.default" in ops
    cpu = aotc.load(compile_function(lambda x, w: x @ w.t(), (x[:1], w), tmp_path / "b.aotc"))
    assert "aten::mm.default" in [s.op for s in cpu.entries["forward"].plan.steps
                                  if s.kind.value == "extern"]


def _kernels(path):
    import json
    plan = aotc.load(path, device="cpu", interpret=True).entries["forward"].plan
    out = {}
    for s in plan.steps:
        if s.kind.value == "kernel":
            spec = json.loads((path / "kernels" / f"{s.name}.json").read_text())
            out[s.name] = (spec["constexprs"], spec["num_warps"],
                           (path / "kernels" / f"{s.name}.py").read_text())
    return out


def test_a_computed_vector_is_stored_once_not_recomputed_by_every_program(tmp_path):
    """SiLU(gate) * up feeding the down projection: stored by the gate/up kernel, loaded by
    the down kernel (inline, each of the down kernel's programs would compute it again)."""
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = (torch.randn(1, 64, generator=g), torch.randn(96, 64, generator=g),
                 torch.randn(96, 64, generator=g))
    w3 = torch.randn(64, 96, generator=g)

    def mlp(x, w1, w2, w3):
        return (torch.nn.functional.silu(x @ w1.t()) * (x @ w2.t())) @ w3.t()
    path = compile_function(mlp, (x, w1, w2, w3), tmp_path / "m.aotc", **CUDA)
    sources = [src for _, _, src in _kernels(path).values()]
    assert len(sources) == 2 and sum("tl.exp" in s for s in sources) == 1
    m = aotc.load(path, device="cpu", interpret=True)
    torch.testing.assert_close(m(x, w1, w2, w3), mlp(x, w1, w2, w3), rtol=1e-4, atol=1e-3)


class _Conv1D(torch.nn.Module):
    """GPT-2's layout: a [K, N] weight that the product reads as it is (addmm(b, x, W))."""

    def __init__(self, k: int, n: int, norm: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(torch.randn(k, n, generator=g) / k ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(n, generator=g))
        self.norm = torch.nn.LayerNorm(k) if norm else None

    def forward(self, x):          # x [1, 1, K], as a decode step's hidden state
        if self.norm is not None:
            x = self.norm(x)
        return torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight)


def test_a_gpu_stores_a_k_by_n_product_weight_transposed_and_reduces_it_in_one_kernel(tmp_path):
    """Read as [K, N], one output's weights lie N apart (an outer reduction, too few programs:
    split in two kernels). Stored as W^T and bound as its transpose view, the product is one
    inner-reduction kernel; the state_dict still hands out the [K, N] weight."""
    model, x = _Conv1D(256, 96).eval(), torch.randn(1, 1, 256)
    path = aotc.export(model, (x,), tmp_path / "m.aotc", **CUDA)
    assert aotc.artifact.format.read_manifest(path).weights.transposed == ("weight",)
    kernels = _kernels(path)
    assert len(kernels) == 1, list(kernels)
    m = aotc.load(path, device="cpu", interpret=True)
    torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-4)
    assert torch.equal(m.state_dict()["weight"], model.weight.detach())
    cpu = aotc.load(aotc.export(model, (x,), tmp_path / "c.aotc"))   # the CPU's own rule
    torch.testing.assert_close(cpu(x), model(x), rtol=1e-4, atol=1e-4)


def test_a_norm_of_a_viewed_row_is_computed_by_the_product(tmp_path):
    """LayerNorm over [1, 1, K] whose output the product reads as [1, K]: each program of the
    product computes the row's statistics itself (codegen/lowering/row_statistics.py), so the
    norm, the product and its bias are one kernel."""
    model, x = _Conv1D(256, 96, norm=True).eval(), torch.randn(1, 1, 256)
    path = aotc.export(model, (x,), tmp_path / "m.aotc", **CUDA)
    assert len(_kernels(path)) == 1, list(_kernels(path))
    m = aotc.load(path, device="cpu", interpret=True)
    torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", ["swap", "rows"])
@pytest.mark.parametrize("m,k,n", [(8, 96, 80), (8, 2048, 512), (5, 100, 33), (16, 64, 2048)],
                         ids=["one-split", "split-k", "ragged", "wide"])
@pytest.mark.parametrize("case", ["mm", "addmm", "conv1d"])
def test_products_of_a_few_half_rows_are_hand_kernels_streaming_the_weight(tmp_path, monkeypatch,
                                                                          m, k, n, case, form):
    """2 to 16 rows in bf16 (decode at a small batch): codegen/triton/skinny_mm.py's kernel in
    either form, no cuBLAS call, no kernel of its own for the sums; K split where the columns alone give too
    few programs, the splits (and the bias) summed by the kernel reading the product (here the
    `* 2`). Against float32 products of the same bf16 values."""
    from aotc.codegen.triton import skinny_mm
    monkeypatch.setattr(skinny_mm, "SWAP_MAX_WEIGHTS", 1 << 30 if form == "swap" else 0)
    g, dt = torch.Generator().manual_seed(0), torch.bfloat16
    x, w = torch.randn(m, k, generator=g).to(dt), (torch.randn(n, k, generator=g) / k ** .5).to(dt)
    b, wt = torch.randn(n, generator=g).to(dt), (torch.randn(k, n, generator=g) / k ** .5).to(dt)
    fn = {"mm": lambda x, w, b, wt: (x @ w.t()) * 2,
          "addmm": lambda x, w, b, wt: torch.addmm(b, x, w.t()) * 2,
          "conv1d": lambda x, w, b, wt: torch.addmm(b, x, wt) * 2}[case]
    path = compile_function(fn, (x, w, b, wt), tmp_path / "m.aotc", **CUDA)
    ops, plan = _ops(path)
    assert not any("mm" in op for op in ops), ops
    kernels = [s for s in plan.steps if s.kind.value == "kernel"]
    reasons = [r for s in kernels for r in s.reasons]
    assert any(f"product of {m} rows, {form} form" in r for r in reasons), reasons
    assert any("K in 1 splits" in r for r in reasons) == (k != 2048), reasons
    assert len(kernels) == 2, reasons    # the product, and the * 2 (adding the splits)
    got = aotc.load(path, device="cpu", interpret=True)(x, w, b, wt)
    want = fn(x.float(), w.float(), b.float(), wt.float())
    assert got.dtype == dt
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=4e-2)


def test_seventeen_rows_or_fp32_keep_gemms(tmp_path):
    w = torch.randn(16, 32)
    for i, x in enumerate((torch.randn(17, 32).bfloat16(), torch.randn(8, 32))):
        fn = lambda x, w: x @ w.t()   # noqa: E731
        ops, _ = _ops(compile_function(fn, (x, w.to(x.dtype)), tmp_path / f"{i}.aotc", **CUDA))
        assert "aten::mm.default" in ops
