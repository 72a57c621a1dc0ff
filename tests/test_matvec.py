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
