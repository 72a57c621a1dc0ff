"""Fusion: kernel counts for canonical patterns and key lines of the emitted C++.

These run the compiler-free half of codegen (lowering + scheduling + C++ text); no C++ compiler
and no GPU is involved, except in the final end-to-end checks.
"""
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

import aotc
from aotc.api import compile_function
from aotc.artifact.schema.plan import CallStep
from aotc.artifact.schema.types import StepKind
from aotc.codegen import lower_and_schedule
from aotc.codegen.cpp.kernel import kernel_source
from aotc.codegen.scheduler import Kernel
from aotc.exporter import trace_function
from aotc import codegen as cg


def schedule(fn, *args):
    program = trace_function(fn, args)
    lowered, steps, decisions = lower_and_schedule(program)
    kernels = [s for s in steps if isinstance(s, Kernel)]
    externs = [s for s in steps if isinstance(s, CallStep) and s.kind is StepKind.EXTERN]
    return program, lowered, steps, kernels, externs


def cpp(fn, *args) -> str:
    _, lowered, steps, kernels, _ = schedule(fn, *args)
    buffers = cg._buffers(lowered.slots)
    stored = cg._stored(steps, lowered.outputs)
    return "\n".join(kernel_source(k, buffers, stored)[0] for k in kernels)


x2 = torch.randn(16, 64)
w = torch.randn(32, 64)
b = torch.randn(32)


def test_linear_bias_gelu_is_one_extern_and_one_kernel():
    """The GEMM runs without its bias (no pre-fill of the output); the epilogue kernel adds the
    bias and applies GELU in one pass."""
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))
    _, _, _, kernels, externs = schedule(fn, x2, w, b)
    assert len(externs) == 1 and externs[0].op == "aten::mm.default"
    assert len(kernels) == 1
    assert kernels[0].nodes[0].body.origins[:2] == ("addmm", "gelu")


def test_linear_epilogue_matches_eager(tmp_path):
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b)) + F.linear(x, w, b)
    m = aotc.load(compile_function(fn, (x2, w, b), tmp_path / "lin.aotc"))
    torch.testing.assert_close(m(x2, w, b), fn(x2, w, b))


def test_softmax_is_one_kernel():
    _, _, _, kernels, externs = schedule(lambda x: torch.softmax(x, -1), x2)
    assert (len(kernels), len(externs)) == (1, 0)
    assert len(kernels[0].nodes) == 3     # max, sum of exp, normalize


def test_layernorm_is_one_kernel():
    wn, bn = torch.randn(64), torch.randn(64)
    _, _, _, kernels, externs = schedule(lambda x, w, b: F.layer_norm(x, (64,), w, b), x2, wn, bn)
    assert (len(kernels), len(externs)) == (1, 0)


def test_residual_add_layernorm_is_one_kernel():
    wn, bn = torch.randn(64), torch.randn(64)
    _, _, _, kernels, _ = schedule(lambda x, y, w, b: F.layer_norm(x + y, (64,), w, b),
                                   x2, torch.randn(16, 64), wn, bn)
    assert len(kernels) == 1
    assert "add" in kernels[0].nodes[-1].body.origins


def test_conv_batchnorm_relu_is_conv_plus_one_kernel():
    x = torch.randn(2, 3, 8, 8)
    cw = torch.randn(4, 3, 3, 3)
    rm, rv, g, bb = torch.randn(4), torch.rand(4) + 0.5, torch.randn(4), torch.randn(4)
    fn = lambda x, cw, rm, rv, g, bb: F.relu(F.batch_norm(F.conv2d(x, cw), rm, rv, g, bb,
                                                          training=False))
    _, _, _, kernels, externs = schedule(fn, x, cw, rm, rv, g, bb)
    assert [e.op for e in externs] == ["aten::convolution.default"]
    assert len(kernels) == 1


def test_pointwise_chain_is_one_kernel_with_one_store():
    src = cpp(lambda x: torch.sigmoid((x * 2 + 1).relu()), x2)
    assert src.count('extern "C"') == 1
    assert src.count("] = ") == 1            # intermediates never touch memory


def test_independent_outputs_fuse_horizontally():
    _, _, _, kernels, _ = schedule(lambda x: (x.sin(), x.cos()), x2)
    assert len(kernels) == 1 and len(kernels[0].nodes) == 2


def test_reduction_over_other_rows_is_not_fused():
    _, _, _, kernels, _ = schedule(lambda x: (torch.softmax(x, -1), x.sum(0)), x2)
    assert len(kernels) == 2


def test_softmax_emits_vectorized_reductions():
    src = cpp(lambda x: torch.softmax(x, -1), x2)
    assert "#pragma omp simd reduction(max:" in src
    assert "#pragma omp simd reduction(+:" in src
    assert "aotc_expf(" in src            # the vectorizable exp, not a libm call
    assert "__restrict__" in src


def test_layernorm_emits_two_pass_statistics_in_registers():
    wn, bn = torch.randn(64), torch.randn(64)
    src = cpp(lambda x, w, b: F.layer_norm(x, (64,), w, b), x2, wn, bn)
    assert src.count("reduction(+:") == 2       # mean, then centered sum of squares
    assert src.count("] = ") == 1               # statistics stay in registers
    assert "std::sqrt(" in src


def test_large_kernels_are_parallel():
    big = torch.randn(256, 512)
    src = cpp(lambda x: torch.softmax(x, -1), big)
    assert "#pragma omp parallel for" in src


def test_dynamic_kernels_test_their_size_before_entering_openmp(tmp_path):
    """OpenMP starts a team for `parallel if(false)` too: a kernel with a dynamic size holds a
    parallel and a serial copy of its loops behind a test of the size, and both are right."""
    from torch.export import Dim

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x * 2, -1) + 1
    p = aotc.export(M(), (torch.randn(64, 96),), tmp_path / "d.aotc",
                    dynamic_shapes=({0: Dim("b", min=2, max=4096)},))
    src = (p / "kernels" / "kernels.cpp").read_text()
    body = src[src.index('extern "C" int kernel0'):]
    # elements, or the work weighted by the body's operations (codegen/cpp/work.py)
    assert "if (96 * s_b >= 32768 || " in body and " >= 131072) {" in body
    assert "} else {" in body
    assert body.count("#pragma omp parallel for") == 1 and " if(" not in body
    m = aotc.load(p)
    for b in (2, 300, 1000):    # serial, then parallel (96 * 1000 >= 32768)
        x = torch.randn(b, 96)
        torch.testing.assert_close(m(x), M()(x))


def test_memory_planning_reuses_dead_kernel_buffers(tmp_path):
    def fn(x):
        a = torch.softmax(x, -1)
        y = a @ a.t()
        c = torch.softmax(y, -1)
        return c @ c
    x = torch.randn(64, 64)
    p = compile_function(fn, (x,), tmp_path / "reuse.aotc")
    m = aotc.load(p)
    plan = m.entries["forward"].plan
    assert any(s.reuse for s in plan.steps if s.kind.value == "kernel")
    torch.testing.assert_close(m(x), fn(x), rtol=1e-5, atol=1e-5)


def test_loading_and_calling_never_starts_a_compiler(tmp_path, monkeypatch):
    p = compile_function(lambda x: torch.softmax(x * 3, -1), (x2,), tmp_path / "nocc.aotc")

    def refuse(*a, **k):
        raise AssertionError(f"a process was started after export: {a}")
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    m = aotc.load(p)
    torch.testing.assert_close(m(x2), torch.softmax(x2 * 3, -1))


def test_out_of_range_index_raises_guard_error(tmp_path):
    table = torch.randn(10, 4)
    ids = torch.tensor([[1, 2], [3, 4]])
    p = compile_function(lambda t, i: F.embedding(i, t) * 2, (table, ids), tmp_path / "emb.aotc")
    m = aotc.load(p)
    torch.testing.assert_close(m(table, ids), F.embedding(ids, table) * 2)
    with pytest.raises(aotc.GuardError, match=r"holds index 40 at position \[1, 1\]") as e:
        m(table, torch.tensor([[1, 2], [3, 40]]))
    assert e.value.where == "input 'input1' (#1)" and "[0, 9]" in e.value.expected
    torch.testing.assert_close(m(table, ids), F.embedding(ids, table) * 2)


# ------------------------------------------------------------------ index arithmetic, reductions

def test_index_simplification_undoes_flatten_and_split():
    import sympy
    from aotc.codegen.ir import FloorDiv, ModIndex, index_bounds, simplify_index
    p0, p1, r0, x0 = sympy.symbols("p0 p1 r0 x0", integer=True, nonnegative=True)
    # a [512, 512] row index split back into [8, 64, 512]: (p0 + 512 r0) -> dims -> 512 r0 + p0
    a = p0 + 512 * r0
    split = ModIndex(a, 512) + 512 * ModIndex(FloorDiv(a, 512), 64) + \
        32768 * ModIndex(FloorDiv(a, 32768), 8)
    assert simplify_index(split, {p0: 512, r0: 512}) == a
    assert simplify_index(FloorDiv(a, 32768), {p0: 512, r0: 512}) == FloorDiv(r0, 64)
    # whole multiples leave a division only when what is left stays non-negative
    assert simplify_index(ModIndex(8192 * p0 + x0, 32), {p0: 8, x0: 384}) == ModIndex(x0, 32)
    assert simplify_index(FloorDiv(-256 + 8192 * p0 + x0, 32), {p0: 8, x0: 384}) == \
        256 * p0 - 8 + FloorDiv(x0, 32)
    assert simplify_index(FloorDiv(-5 + 8192 * p0 + x0, 32), {p0: 8, x0: 384}) == \
        FloorDiv(-5 + 8192 * p0 + x0, 32)   # x0 - 5 may be negative: C's / would truncate
    assert index_bounds(FloorDiv(r0, 64), {r0: 512}) == (0, 7)
    assert index_bounds(3 * ModIndex(p1, 64), {p1: 10}) == (0, 27)


@pytest.mark.parametrize("shape,dims", [((512, 384), 0), ((8, 64, 384), (0, 1)),
                                        ((37, 45), 0), ((4, 100, 70), 1)])
def test_column_sums_accumulate_by_blocks_of_columns(shape, dims, tmp_path):
    """A sum over rows (a bias gradient) reads along the kept dim: it is reduced row by row
    into blocks of accumulators, vectorized along the columns, not gathered down each one."""
    x = torch.randn(*shape)
    fn = lambda x: (x * 2).sum(dims)
    text = cpp(fn, x)
    assert "by columns of 64" in text
    assert re.search(r"acc0\[(p\d) - xb\] = acc0\[\1 - xb\] \+", text)
    m = aotc.load(compile_function(fn, (x,), tmp_path / "c.aotc"))
    torch.testing.assert_close(m(x), fn(x), rtol=1e-5, atol=1e-4)


def test_row_sums_keep_the_vectorized_reduction():
    assert "by columns" not in cpp(lambda x: x.sum(-1), torch.randn(64, 128))


def test_cat_parts_index_with_their_own_bounded_variable(tmp_path):
    """Inside its mask a part of `cat` reads through a named index in [0, its size), so the
    view arithmetic of permuted parts folds (no division left of the flattened row index)."""
    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    fn = lambda q, k: torch.cat([q.transpose(1, 2).reshape(2, 8, 64),
                                 k.transpose(1, 2).reshape(2, 8, 64)], -1) * 3
    text = cpp(fn, q, k)
    assert "int64_t t" in text and "(-64 + x0)" in text
    assert "8192" not in text
    m = aotc.load(compile_function(fn, (q, k), tmp_path / "cat.aotc"))
    torch.testing.assert_close(m(q, k), fn(q, k))


def test_max_pool_indices_are_kernels_that_match_aten(tmp_path):
    """Training saves max_pool2d's indices: they are computed by a kernel (positions held as
    floats so the loop vectorizes), with ATen's tie and NaN rules, also with padding and
    ceil_mode windows."""
    import json
    x = torch.randn(2, 3, 9, 9)
    x[0, 0, 0, :3] = 5.0                 # ties keep the first
    x[1, 1, 2, 2] = float("nan")         # NaN wins
    for k, st, pad, ceil in [(2, 2, 0, False), (3, 2, 1, False), (3, 2, 1, True)]:
        fn = lambda x: F.max_pool2d(torch.relu(x), k, st, pad, ceil_mode=ceil,
                                    return_indices=True)
        p = compile_function(fn, (x,), tmp_path / f"mp{k}{pad}{ceil}.aotc")
        plan = json.loads((p / "plans/forward.json").read_text())
        assert {s["kind"] for s in plan["steps"]} <= {"kernel", "free"}
        got, want = aotc.load(p)(x), fn(x)
        torch.testing.assert_close(got[0], want[0], equal_nan=True)
        assert torch.equal(got[1], want[1])
    text = cpp(lambda x: F.max_pool2d(x, 2, 2, return_indices=True)[1], x)
    assert "||" not in text and "static_cast<float>(" in text


def test_relu_keeps_nan_and_clears_negatives_in_kernels(tmp_path):
    x = torch.tensor([1.5, -2.0, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), -1e-40,
                      1e-40, 3.0] * 4)
    fn = lambda x: (torch.relu(x) * 2, torch.relu(x) <= 0)
    m = aotc.load(compile_function(fn, (x,), tmp_path / "relu.aotc"))
    got, want = m(x), fn(x)
    torch.testing.assert_close(got[0], want[0], equal_nan=True)
    assert torch.equal(got[1], want[1])


def test_independent_reductions_stay_within_a_launch_specs_blocks():
    """A backward's bias and norm gradients are independent reductions over the same rows: they
    fuse horizontally, but no kernel takes more block sizes than a launch spec holds (a ViT-S/16
    training export once wrote a kernel of 102 and failed at its end)."""
    from aotc.artifact.schema.launch import BLOCK_NODES, MAX_BLOCKS
    x = torch.randn(16, 100 * 4)
    program = trace_function(lambda x: [c.sum(0) for c in x.split(4, dim=1)], (x,))
    _, steps, decisions = lower_and_schedule(program)
    sizes = [len(k.nodes) for k in steps if isinstance(k, Kernel)]
    assert sum(sizes) >= 100 and len(sizes) >= 2, sizes
    assert max(sizes) < min(MAX_BLOCKS, BLOCK_NODES), sizes
    assert any("block sizes, the most a launch spec holds" in d for d in decisions)


def test_independent_reductions_export_for_cuda_within_the_schema(tmp_path):
    """The same program cross-compiled for a GPU: every launch spec fits the schema it is read
    with, checked as codegen writes it."""
    pytest.importorskip("triton")
    x = torch.randn(16, 100 * 4)
    path = compile_function(lambda x: [c.sum(0) for c in x.split(4, dim=1)], (x,),
                            tmp_path / "r.aotc", target="cuda:sm_90")
    m = aotc.load(path, interpret=True)
    for got, want in zip(m(x), [c.sum(0) for c in x.split(4, dim=1)]):
        torch.testing.assert_close(got, want)


def test_a_kernel_of_many_buffers_loads_in_both_runners(tmp_path):
    """40 sums of 40 inputs fuse into one kernel of 80 buffers: the C++ runner takes as many
    extents as a launch spec may hold (rules.MAX_KERNEL_BUFFERS, one limit for both front ends;
    it once took at most 64 and refused a ViT-S/16 backward at load)."""
    pytest.importorskip("triton")
    xs = [torch.randn(16, 4) for _ in range(40)]
    path = compile_function(lambda *xs: [x.sum(0) for x in xs], xs, tmp_path / "b.aotc",
                            target="cuda:sm_90")
    from aotc.runtime.cpp_runner import runner_status
    for runner in ("cpp", "python") if runner_status()[1] is None else ("python",):
        m = aotc.load(path, interpret=True, runner=runner)
        for got, x in zip(m(*xs), xs):
            torch.testing.assert_close(got, x.sum(0))
