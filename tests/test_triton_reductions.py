"""Outer and split reductions of the Triton backend (codegen/triton/blocks.py, codegen/graph.py).

  (a) the planner: a column sum (loads contiguous along the kernel's rows, strided along the
      reduced elements) gets a wide XBLOCK and a small looped R block; reductions along
      contiguous rows keep the row plan; BlockConfig overrides reproduce either;
  (b) split reductions: for CUDA targets a long reduction onto few outputs runs in two stages
      (partials in the accumulation dtype, then a reduction over them); the rule, and that
      CPU targets keep one stage;
  (c) numerics through Triton's interpreter against eager: column sums and their kin in fp32
      and bf16, layer-norm-backward-like fused sums, channels-last batch-norm statistics, full
      sums, ragged and unsplittable sizes, a dynamic reduction length;
  (d) the compiled code: an outer reduction's loads vectorize along the rows.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

import aotc
from aotc.api import compile_function
from aotc.codegen import _buffers, _stored, lower_and_schedule
from aotc.codegen.ir import sym
from aotc.codegen.scheduler import Kernel
from aotc.codegen.triton import blocks
from aotc.codegen.triton.autotune import candidates
from aotc.codegen.triton.blocks import (BlockConfig, heuristic_config, plan_blocks,
                                        reduction_order, split_reduction)
from aotc.exporter import trace_function

triton = pytest.importorskip("triton")
# every load and store of an interpreted artifact kernel stays inside its tensors
from test_triton import (OLD_INTERPRETER, interpreted,  # noqa: E402, F401
                         interpreted_accesses_stay_in_bounds)

TARGET = "cuda:sm_90"
BF16 = torch.bfloat16


def kernels_of(fn, args, split: bool = False) -> tuple[list, dict, set]:
    """(scheduled kernels, buffers, stored names) of `fn` traced on `args`; `split`: lowered
    as for a CUDA target (split reductions)."""
    lowered, steps, _ = lower_and_schedule(trace_function(fn, args), split_reductions=split)
    return ([s for s in steps if isinstance(s, Kernel)], _buffers(lowered.slots),
            _stored(steps, lowered.outputs))


def modes(plan) -> list:
    return [(b.mode, b.size, b.rmask) for b in plan.nodes]


def row_plan(kernel, buffers, config=None):
    """The plan `kernel` would get were it never taken for an outer reduction."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(blocks, "_is_outer", lambda k: False)
        return plan_blocks(kernel, buffers, config)


# ---------------------------------------------------------------------------- (a) the planner

def test_column_sum_is_planned_wide_along_the_rows():
    """A bias gradient (sum over the 2048 rows of [2048, 768]), in one stage: 32 consecutive
    columns per program (64, halved for programs), the rows looped 32 at a time; before, one
    column per program and the whole strided column in one block."""
    (k,), buffers, _ = kernels_of(lambda x: x.sum(0), (torch.randn(2048, 768),))
    plan = plan_blocks(k, buffers)
    assert plan.outer and plan.xblock == 32 and not plan.xmask
    assert modes(plan) == [("loop", 32, None)]
    assert plan.num_warps == 4 and plan.grid() == ["24", "1", "1"]
    old = row_plan(k, buffers)
    assert not old.outer and old.xblock == 1 and modes(old) == [("single", 2048, None)]
    config = heuristic_config(plan)
    assert config == BlockConfig(xblock=32, rblock=32, num_warps=4)
    assert plan_blocks(k, buffers, config) == plan


def test_reductions_along_contiguous_rows_keep_the_row_plan():
    x, w = torch.randn(64, 768), torch.randn(768)
    for fn, args in ((lambda x: x.sum(-1), (x,)), (lambda x: torch.softmax(x, -1), (x,)),
                     (lambda x, w: torch.nn.functional.layer_norm(x, (768,), w), (x, w)),
                     (lambda x: (x.sum(-1), x.amax(-1)), (torch.randn(4, 6000),))):
        kernels, buffers, _ = kernels_of(fn, args, split=True)
        for k in kernels:
            plan = plan_blocks(k, buffers)
            assert not plan.outer and plan == row_plan(k, buffers)
    (k,), buffers, _ = kernels_of(lambda x: x.sum(-1), (x,))
    assert modes(plan_blocks(k, buffers)) == [("single", 1024, "rmask0")]


def test_the_vote_of_the_loads():
    """Loads contiguous along the rows and strided along the reduction vote outer; any load
    contiguous along the reduction votes inner; per-row or per-element operands abstain."""
    from aotc.codegen.ir import FloorDiv, ModIndex, index_vars
    (p0,), (r0, r1) = index_vars("p", 1), index_vars("r", 2)
    rows, inner = {p0: sym(128)}, {r0: sym(8), r1: sym(64)}
    outer_load = ("a", p0 + 8192 * r0 + 128 * r1)
    per_element = ("m", 64 * r0 + r1)
    assert reduction_order([outer_load, per_element], rows, inner) == "outer"
    assert reduction_order([outer_load, ("b", 512 * p0 + 64 * r0 + r1)], rows, inner) == "inner"
    assert reduction_order([per_element, ("c", p0)], rows, inner) == "inner"
    # a view splitting the rows into heads (attention's bias gradients): steps of 1 along p0
    heads = ("d", 2048 * FloorDiv(p0, 32) + ModIndex(p0, 32) + 8192 * r0 + 32 * r1)
    assert reduction_order([heads], rows, inner) == "outer"


def test_outer_configs_reproduce_their_plans():
    """`heuristic_config` gives the config a plan was made with, for the heuristic's and for
    each autotune candidate of outer kernels (one whose elements fit an R block, too)."""
    cases = [(lambda x: x.sum(0), (torch.randn(2048, 768),)),
             (lambda x: x.sum(0), (torch.randn(8, 8192),)),            # 8 elements per column
             (lambda x: (x.sum((0, 1)), x.amax((0, 1))), (torch.randn(4, 25, 48),)),
             (lambda x: x.sum(0), (torch.randn(1000, 3),))]            # few columns
    for fn, args in cases:
        (k,), buffers, _ = kernels_of(fn, args)
        plan = plan_blocks(k, buffers)
        assert plan.outer
        configs = candidates(k, buffers)
        assert configs[0] == heuristic_config(plan) and len(configs) > 1
        for c in configs:
            assert heuristic_config(plan_blocks(k, buffers, c)) == c
    (k,), buffers, _ = kernels_of(*cases[1])
    plan = plan_blocks(k, buffers)   # 8 elements: one block; XBLOCK halved to 128 programs
    assert modes(plan) == [("single", 8, None)] and plan.xblock == 64
    (k,), buffers, _ = kernels_of(*cases[3])
    plan = plan_blocks(k, buffers)   # 3 columns: a narrow X block and a wide R block
    assert plan.xblock == 4 and modes(plan) == [("loop", 512, "rmask0")] and plan.xmask


# ----------------------------------------------------------------------- (b) split reductions

def test_the_split_rule():
    assert split_reduction((sym(768),), (sym(2048),), True) == (16, 0, 128)
    assert split_reduction((sym(768),), (sym(16), sym(128)), True) == (16, 0, 1)
    assert split_reduction((sym(3072),), (sym(2048),), True) == (4, 0, 512)
    assert split_reduction((), (sym(2048), sym(768)), False) == (128, 0, 16)   # a full sum
    assert split_reduction((sym(16),), (sym(100000),), False) == (10, 0, 10000)
    assert split_reduction((sym(768),), (sym(64),), True) is None            # too little work
    assert split_reduction((sym(8192),), (sym(2048),), True) == (2, 0, 1024)
    assert split_reduction((sym(16384),), (sym(2048),), True) is None        # programs enough
    assert split_reduction((sym(4096),), (sym(2048),), False) is None
    assert split_reduction((sym(768),), (sym(1009),), True) is None          # a prime length
    assert split_reduction((sym("batch"),), (sym(2048),), True) is None      # dynamic
    assert split_reduction((sym(768),), (sym("seq"),), True) is None


def test_column_sum_splits_in_two_stages_for_cuda():
    kernels, buffers, stored = kernels_of(lambda x: x.sum(0), (torch.randn(2048, 768),),
                                          split=True)
    first, second = kernels
    (part,) = first.nodes[0].buffers
    assert first.prefix == (16, 768) and first.nodes[0].body.reduction_ranges == (128,)
    assert part.dtype == torch.float32 and part.name in stored
    assert second.prefix == (768,) and second.nodes[0].body.reduction_ranges == (16,)
    assert "split16" in first.nodes[0].body.origins
    plan = plan_blocks(first, buffers)
    assert plan.outer and plan.xblock == 64 and modes(plan) == [("loop", 32, None)]
    assert plan.grid() == ["192", "1", "1"] and plan.num_warps == 4
    plan = plan_blocks(second, buffers)
    assert plan.outer and modes(plan) == [("single", 16, None)] and plan.grid()[0] == "24"


def test_fused_sums_split_alike_and_stay_fused():
    """Layer-norm backward's weight and bias gradients (two sums over the same rows) split
    the same way: one kernel per stage, both sums in each."""
    g, x = torch.randn(2048, 768), torch.randn(2048, 768)
    m, s = torch.randn(2048, 1), torch.rand(2048, 1)
    kernels, _, _ = kernels_of(lambda g, x, m, s: ((g * (x - m) * s).sum(0), g.sum(0)),
                               (g, x, m, s), split=True)
    assert [(k.prefix, len(k.nodes)) for k in kernels] == [((16, 768), 2), ((768,), 2)]


def test_few_rows_loop_in_blocks_of_max_persistent():
    """A kernel of at most FEW_ROWS rows is bound by latency: a row longer than a block (the
    greedy token's argmax over a vocabulary at batch 1) loops FEW_ROWS_LOOP elements at a
    time with FEW_ROWS_LOOP_WARPS, an eighth of the round trips of LOOP_BLOCK; many rows keep
    LOOP_BLOCK and the warps of their blocks."""
    for rows, size, warps in ((1, blocks.FEW_ROWS_LOOP, blocks.FEW_ROWS_LOOP_WARPS),
                              (blocks.FEW_ROWS, blocks.FEW_ROWS_LOOP, blocks.FEW_ROWS_LOOP_WARPS),
                              (64, blocks.LOOP_BLOCK, 4)):
        (k,), buffers, _ = kernels_of(lambda x: x.argmax(-1, keepdim=True),
                                      (torch.randn(rows, 32000),))
        plan = plan_blocks(k, buffers)
        assert modes(plan) == [("loop", size, "rmask0")] and plan.num_warps == warps


def test_only_long_reductions_onto_few_outputs_split():
    for fn, args in ((lambda x: x.sum(-1), (torch.randn(256, 4096),)),
                     (lambda x: x.sum(0), (torch.randn(64, 768),)),
                     (lambda x: torch.var_mean(x, 0), (torch.randn(2048, 768),)),
                     (lambda x: x.argmax(0), (torch.randn(2048, 768),))):
        assert len(kernels_of(fn, args, split=True)[0]) == len(kernels_of(fn, args)[0])


def test_cpu_targets_keep_one_stage(tmp_path):
    fn, args = (lambda x: x.sum(0)), (torch.randn(2048, 768),)
    for target, kernels in (("cpu", 1), (TARGET, 2)):
        p = compile_function(fn, args, tmp_path / f"{target[:3]}.aotc", target=target)
        plan = json.loads((p / "plans/forward.json").read_text())
        assert plan["stats"]["kernels"] == kernels


# --------------------------------------------------------------- (c) numerics, interpreted

_g = torch.Generator().manual_seed(0)


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_g).to(dtype)


CASES = {
    # split in 8 (outer), fp32 and bf16 (partials in fp32)
    "column_sum": (lambda x: x.sum(0), (_r(1024, 256),)),
    "column_sum_bf16": (lambda x: x.sum(0), (_r(1024, 256, dtype=BF16),)),
    "column_mean_keepdim": (lambda x: x.mean((0, 1), keepdim=True), (_r(8, 128, 96),)),
    "column_reductions": (lambda x: (x.amax(0), x.amin(0), (1 + x / 64).prod(0),
                                     (x > 3).any(0), (x > -3.5).all(0)), (_r(1024, 128),)),
    "layer_norm_backward_sums": (lambda g, x, m, s: ((g * (x - m) * s).sum(0), g.sum(0)),
                                 (_r(512, 192), _r(512, 192), _r(512, 1), _r(512, 1).abs())),
    "layer_norm_backward_sums_bf16": (
        lambda g, x, m, s: ((g.float() * (x.float() - m) * s).sum((0, 1)).to(BF16),
                            g.sum((0, 1))),
        (_r(4, 128, 96, dtype=BF16), _r(4, 128, 96, dtype=BF16), _r(4, 128, 1),
         _r(4, 128, 1).abs())),
    "batch_norm_stats_channels_last": (
        lambda x: (x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)), torch.var_mean(x, (0, 2, 3))),
        (_r(8, 32, 16, 16).to(memory_format=torch.channels_last),)),
    # heads-major gradient summed into a [heads * dim] bias (attention's q/k/v bias grads)
    "bias_grad_of_a_permute": (lambda x: x.transpose(1, 2).reshape(512, 128).sum(0),
                               (_r(8, 4, 64, 32),)),
    "full_sums": (lambda x: (x.sum(), x.amax(), x.abs().amin(), x.mean()), (_r(512, 1024),)),
    "ragged": (lambda x: (x.sum(0), x.sum(1)), (_r(1000, 100),)),   # 5 chunks; 100 columns
    "prime_length": (lambda x: x.sum(0), (_r(1009, 64),)),        # no split: one stage
    # a greedy token at batch 1: one program looping MAX_PERSISTENT at a time, ties to the
    # first index, the last block ragged; NaN wins as in torch
    "argmax_of_a_vocabulary": (lambda x: (x.argmax(-1, keepdim=True),
                                          x.clamp(max=2.0).to(BF16).argmax(-1)),
                               (_r(2, 10007),)),
    "argmax_with_nan": (lambda x: x.argmax(-1), (_r(1, 9001).index_fill(-1, torch.tensor(
        [8000, 6000]), float("nan")),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduction_matches_eager_through_the_interpreter(name, tmp_path):
    fn, args = CASES[name]
    m = interpreted(fn, args, tmp_path / f"{name}.aotc")
    low = any(a.dtype == BF16 for a in args)
    tol = dict(rtol=1e-2, atol=1e-2) if low else dict(rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(m(*args), fn(*args), **tol)


def test_split_reductions_are_in_the_plan(tmp_path):
    fn, args = CASES["layer_norm_backward_sums"]
    p = compile_function(fn, args, tmp_path / "ln.aotc", target=TARGET)
    plan = json.loads((p / "plans/forward.json").read_text())
    kernels = [s for s in plan["steps"] if s["kind"] == "kernel"]
    assert len(kernels) == 2 and [len(s["fused"]) for s in kernels] == [2, 2]
    first = json.loads((p / "kernels" / f"{kernels[0]['name']}.json").read_text())
    assert first["constexprs"]["XBLOCK"] >= 32 and first["constexprs"]["R0_BLOCK"] == 32


def test_dynamic_reduction_length(tmp_path):
    """An outer reduction over a dynamic number of rows: looped, masked, not split."""
    from torch.export import Dim

    class M(torch.nn.Module):
        def forward(self, x):
            return x.sum(0), x.amax(0)
    p = aotc.export(M(), (torch.randn(300, 48),), tmp_path / "dyn.aotc", target=TARGET,
                    dynamic_shapes=({0: Dim("batch", min=2, max=4096)},))
    assert len(list((p / "kernels").glob("*.json"))) == 1
    if OLD_INTERPRETER:
        pytest.skip("Triton < 3.9's interpreter cannot loop to a size argument under NumPy 2")
    m = aotc.load(p, device="cpu", interpret=True)
    for n in (2, 300, 1500):
        x = torch.randn(n, 48)
        torch.testing.assert_close(m(x), M()(x), rtol=1e-5, atol=1e-4)


def test_dynamic_row_length_gets_blocks_for_its_example_size(tmp_path):
    """A softmax over a dynamic row length loops over it (any size must fit) with an R block
    sized for the example (96: blocks of 128), not the largest block with most lanes masked
    off, and as many rows per program as fill it. Other sizes stay correct."""
    from torch.export import Dim

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x * 2, -1)
    p = aotc.export(M(), (torch.randn(64, 96),), tmp_path / "dyn.aotc", target=TARGET,
                    dynamic_shapes=({1: Dim("seq", min=2, max=4096)},))
    (spec_file,) = (p / "kernels").glob("*.json")
    spec = json.loads(spec_file.read_text())
    assert set(spec["constexprs"]) >= {"R0_BLOCK", "XBLOCK"}
    assert {v for k, v in spec["constexprs"].items() if k.startswith("R")} == {128}
    assert spec["constexprs"]["XBLOCK"] == 2048 // 128        # a reduction program's elements
    # rows that fit the block take the single-block form (one load per element), longer rows
    # the loops
    src = spec_file.with_suffix(".py").read_text()
    assert "if (s_seq <= R0_BLOCK)" in src and "for roff0 in range(0, s_seq, R0_BLOCK)" in src
    if OLD_INTERPRETER:
        pytest.skip("Triton < 3.9's interpreter cannot loop to a size argument under NumPy 2")
    m = aotc.load(p, device="cpu", interpret=True)
    for n in (2, 96, 128, 129, 300):
        x = torch.randn(64, n)
        torch.testing.assert_close(m(x), M()(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- (d) the compiled code

def _ptx(p, name: str) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from aotc.codegen.triton.build import load_module
    spec = json.loads((p / "kernels" / f"{name}.json").read_text())
    fn = getattr(load_module(name, (p / "kernels" / f"{name}.py").read_text()), name)
    signature = {q["name"]: q["type"] for q in spec["params"]}
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values())
             if t.startswith("*")}
    constexprs = dict(spec["constexprs"], AOTC_PDL=True)      # an sm_90 build's
    signature.update({c: "constexpr" for c in constexprs})
    compiled = triton.compile(ASTSource(fn=fn, signature=signature,
                                        constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": spec["num_warps"], "num_stages": 1,
                                       "enable_fp_fusion": True})   # as build.py compiles
    return compiled.asm["ptx"]


def test_outer_loads_vectorize_along_the_rows(tmp_path):
    """Triton finds the rows contiguous in the [XBLOCK, R] tile and loads several consecutive
    columns per thread (one column per program, as before, loads one element at a time)."""
    fn, args = (lambda x: x.sum(0)), (_r(64, 8192, dtype=BF16),)   # one stage
    p = compile_function(fn, args, tmp_path / "v.aotc", target=TARGET)
    (spec,) = [json.loads(f.read_text()) for f in (p / "kernels").glob("*.json")]
    assert spec["constexprs"]["XBLOCK"] == 64
    loads = re.findall(r"ld\.global[\w.]*", _ptx(p, spec["name"]))
    assert loads and all(re.search(r"\.v[248]\.", ld) for ld in loads)


def test_training_gradients_with_split_reductions(tmp_path):
    """A training step whose bias and layer-norm gradients are split reductions (1024 rows
    onto 96 columns), through the interpreter: every gradient matches eager's."""
    import copy
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.LayerNorm(96),
                                torch.nn.GELU(), torch.nn.Linear(96, 32))
    x = torch.randn(1024, 64)
    ref = copy.deepcopy(model).train()
    p = aotc.export(model, (x,), tmp_path / "train.aotc", train=True, target=TARGET)
    plan = json.loads((p / "plans/backward.json").read_text())
    assert any("split" in op for s in plan["steps"] if s["kind"] == "kernel"
               for f in s["fused"] for op in f["ops"])
    m = aotc.load(p, device="cpu", interpret=True)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    w = torch.randn(1024, 32, generator=torch.Generator().manual_seed(1))
    (m(xa) * w).sum().backward()
    (ref(xb) * w).sum().backward()
    for (n, a), (_, b) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=lambda s: f"{n}: {s}")
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
