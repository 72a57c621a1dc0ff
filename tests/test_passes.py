"""Codegen as a pass list (codegen/passes.py): the list is a chain of typed passes run by one
driver, both backends implement one `Backend` protocol, the loop IR and plans print readably,
and `--dump-passes` writes each pass's output while leaving the artifact byte for byte as it
is without it."""
from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import aotc
from aotc.api import compile_function
from aotc.codegen import lower_and_schedule
from aotc.codegen.backend import Backend, KernelGroup, backend_for
from aotc.codegen.kernel_steps import buffers_of, stored_buffers
from aotc.codegen.passes import PASSES, run_passes
from aotc.codegen.printer import kernel_text, lowered_text, plan_text
from aotc.codegen.scheduler import Kernel
from aotc.codegen.stages import Context, Graphs
from aotc.codegen.target import Target
from aotc.errors import LoweringError
from aotc.exporter import trace_function


def kernels_of(fn, *args):
    lowered, steps, _ = lower_and_schedule(trace_function(fn, args))
    return lowered, steps, [s for s in steps if isinstance(s, Kernel)]


def tree_bytes(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_the_pass_list_is_a_chain_of_typed_passes():
    names = [p.name for p in PASSES]
    assert names == ["graph", "layouts", "lower", "schedule", "weights", "kernels", "plan",
                     "build", "artifact"]
    for before, after in zip(PASSES, PASSES[1:]):
        assert after.input is before.output, (before.name, after.name)
    # a pass that may be skipped hands its input on: it must make what it was given
    assert all(p.input is p.output for p in PASSES if p.when is not None)


def test_the_driver_refuses_a_pass_given_the_wrong_stage(tmp_path):
    program = trace_function(lambda x: x + 1, (torch.randn(2, 3),))
    ctx = Context(program=program, target=Target(device="cpu"), backend=None, dest=tmp_path)
    with pytest.raises(LoweringError, match="pass schedule was given a Graphs"):
        run_passes(ctx, program, (PASSES[0], PASSES[3]))
    out = run_passes(ctx, program, PASSES[:1])
    assert isinstance(out, Graphs) and set(out.graphs) == {"forward"}


def test_both_backends_implement_one_protocol():
    cpp = backend_for(Target(device="cpu"), codegen=True, isa="native")
    gpu = backend_for(Target(device="cuda", archs=("sm_90",)), codegen=True,
                      hints={"example": {}, "maximum": {}})
    assert backend_for(Target(device="cpu"), codegen=False) is None
    assert isinstance(cpp, Backend) and isinstance(gpu, Backend)
    for method in ("lowering", "generate", "build", "native"):
        assert (inspect.signature(getattr(type(cpp), method))
                == inspect.signature(getattr(type(gpu), method))), method
    assert gpu.lowering(True).split_reductions and not cpp.lowering(True).split_reductions
    assert cpp.lowering(True).fuse_attention and not cpp.lowering(False).fuse_attention


def test_both_backends_generate_the_same_kernels_with_one_call():
    """The same kernel groups through either backend: a source per kernel and a signature
    naming the buffers it writes (no compiler runs in `generate`)."""
    lowered, steps, kernels = kernels_of(lambda x: torch.softmax(x, -1) * 2,
                                         torch.randn(4, 16))
    group = KernelGroup(entry="forward", kernels=tuple(kernels),
                        buffers=buffers_of(lowered.slots, steps),
                        stored=frozenset(stored_buffers(steps, lowered.outputs)))
    names = {k.name for k in kernels}
    for backend in (backend_for(Target(device="cpu"), codegen=True, isa="native"),
                    backend_for(Target(device="cuda", archs=("sm_90",)), codegen=True,
                                hints={"example": {}, "maximum": {}})):
        made = backend.generate([group])
        assert set(made.signatures) == set(made.texts) == names, backend.name
        for k in kernels:
            assert made.signatures[k.name].outputs == [b.name for b in k.writes
                                                       if b.name in group.stored]
        launches = {s.launch is not None for s in made.signatures.values()}
        assert launches == {backend.name == "triton"}


def test_the_loop_ir_prints_loads_reductions_and_indices():
    _, _, (k,) = kernels_of(lambda x: torch.softmax(x, -1), torch.randn(4, 16))
    text = kernel_text(k)
    assert text.startswith("kernel kernel0: rows [4], 3 nodes")
    assert "max reduction (x0 < 4) over (r0 < 16)  [softmax_max]" in text
    assert "sum reduction (x0 < 4) over (r0 < 16)" in text
    assert "load buf0[r0 + 16*x0]" in text       # the reductions read along the row
    assert "load buf0[16*x0 + x1]" in text       # the normalization over the whole row
    assert "exp(" in text and "reduce " in text and "store " in text
    assert "# fused buf3 (softmax_sum): vertical" in text


def test_the_loop_ir_prints_runtime_indices_and_masks():
    _, _, (k,) = kernels_of(lambda i, t: F.embedding(i, t) * 2, torch.tensor([[1, 2]]),
                            torch.randn(10, 8))
    text = kernel_text(k)
    assert "ind0 = indirect t0 in [0, 10) (negatives refused; aten::embedding.default)" in text
    assert "load buf1[8*ind0 + x2]" in text
    _, _, (k,) = kernels_of(lambda x: F.pad(x, (1, 1)) + 1, torch.randn(4, 6))
    text = kernel_text(k)
    assert "pointwise (x0 < 4, x1 < 8)" in text
    inside = text[text.index("else 0.0 {"):text.index("}")]   # the load stays in its mask
    assert "load buf0[6*x0 + x1 - 1]" in inside and "yield" in inside


def test_lowered_graphs_print_the_kernels_lowerings_write_by_hand():
    """A GPU product of a few half rows is a hand-written kernel in the lowered graph (the
    --dump-passes of a CUDA generator printed none before: a TypeError)."""
    w = torch.randn(512, 256, dtype=torch.float16)
    program = trace_function(lambda x: torch.relu(x @ w), (torch.randn(4, 512).half(),))
    lowered, _, _ = lower_and_schedule(program, split_reductions=True)
    text = lowered_text(lowered)
    assert "  0  kernel kernel0 (hand-written): reads buf0, buf1; writes buf4" in text
    assert "# product of 4 rows" in text and "= pointwise (x0 < 4, x1 < 256)" in text


def test_plans_print_slots_and_steps():
    plan = {"entry": "forward", "inputs": [1], "outputs": [{"slot": 3}],
            "slots": [{"id": 0, "kind": "weight", "weight": "fc.weight", "dtype": "float32",
                       "shape": [8, 4], "stride": [1, 8], "layout": "transposed"},
                      {"id": 1, "kind": "input", "name": "x", "dtype": "float32",
                       "shape": ["batch", 8], "stride": [8, 1]},
                      {"id": 2, "kind": "value", "dtype": "float32", "shape": ["batch", 4],
                       "stride": [4, 1]},
                      {"id": 3, "kind": "value", "dtype": "float32", "shape": ["batch", 4],
                       "stride": [4, 1]}],
            "steps": [{"kind": "extern", "op": "aten::mm.default", "args": [{"slot": 1},
                                                                           {"slot": 0}],
                       "kwargs": {}, "out": [2]},
                      {"kind": "kernel", "name": "kernel0", "args": [2], "out": [3],
                       "sizes": ["batch"], "fused": [{"buffers": ["buf3"], "ops": ["relu"]}]},
                      {"kind": "free", "slots": [1, 2]}],
            "stats": {"peak_bytes": 64}}
    text = plan_text(plan)
    assert "%0 weight fc.weight: float32[8, 4] stride [1, 8] layout=\"transposed\"" in text
    assert "%1 input x: float32[batch, 8] stride [8, 1]" in text
    lines = text.splitlines()
    steps = lines[lines.index("steps:") + 1:]
    assert steps[0] == "  0  %2 = extern aten::mm.default(%1, %0)"
    assert steps[1] == "  1  %3 = kernel kernel0(%2) sizes [batch]"
    assert "fuses buf3 (relu)" in steps[2] and steps[3] == "  2  free %1, %2"
    assert "  peak_bytes: 64" in text


def _fn(x, w):
    return torch.softmax(x @ w, -1) * torch.sigmoid(x[:, :16])


def test_dump_passes_writes_each_pass_and_leaves_the_artifact_as_it_is(tmp_path):
    args = (torch.randn(4, 32), torch.randn(32, 16))
    plain = compile_function(_fn, args, tmp_path / "plain.aotc", isa="native")
    again = compile_function(_fn, args, tmp_path / "again.aotc", isa="native")
    dumped = compile_function(_fn, args, tmp_path / "dumped.aotc", isa="native",
                              dump_passes=str(tmp_path / "dump"))
    # the same model and options make the same bytes, dumped or not
    assert tree_bytes(plain) == tree_bytes(again) == tree_bytes(dumped)
    d = tmp_path / "dump"
    files = sorted(str(p.relative_to(d)) for p in d.rglob("*.txt"))
    assert files == ["05-weights.txt", "08-build.txt", "09-artifact.txt",
                     "forward/01-graph.txt", "forward/03-lower.txt", "forward/04-schedule.txt",
                     "forward/06-kernels.txt", "forward/07-plan.txt", "passes.txt"]
    index = (d / "passes.txt").read_text().splitlines()
    assert index[1].startswith("02 layouts")
    assert index[1].endswith("(skipped: GPU inference only)")
    assert index[2].startswith("03 lower     Graphs -> Lowered") and index[2].endswith(" s)")
    assert "aten::mm.default(%0, %1)" in (d / "forward/01-graph.txt").read_text()
    assert "sum reduction" in (d / "forward/03-lower.txt").read_text()
    schedule = (d / "forward/04-schedule.txt").read_text()
    assert "kernel kernel0: rows [4]" in schedule and "decisions:" in schedule
    assert 'extern "C" int kernel0(' in (d / "forward/06-kernels.txt").read_text()
    plan = (d / "forward/07-plan.txt").read_text()
    assert plan.startswith("plan forward\n") and "= kernel kernel0(" in plan
    assert "kernels/kernels.cpp" in (d / "08-build.txt").read_text()
    assert '"format_version"' in (d / "09-artifact.txt").read_text()


def test_dump_passes_of_an_aten_only_export(tmp_path):
    args = (torch.randn(4, 32), torch.randn(32, 16))
    compile_function(_fn, args, tmp_path / "a.aotc", codegen=False,
                     dump_passes=str(tmp_path / "dump"))
    d = tmp_path / "dump"
    assert (d / "forward/06-kernels.txt").read_text() == "no kernels\n"
    assert "extern aten::_softmax.default(" in (d / "forward/07-plan.txt").read_text()
    assert "native: none" in (d / "08-build.txt").read_text()


def test_the_api_takes_dump_passes_and_leaves_it_out_of_the_manifest(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    x = torch.randn(2, 8)
    path = aotc.export(model, (x,), tmp_path / "m.aotc", isa="native",
                       dump_passes=str(tmp_path / "dump"))
    assert (tmp_path / "dump/forward/03-lower.txt").is_file()
    m = aotc.load(path)
    assert "dump_passes" not in m.manifest.options
    torch.testing.assert_close(m(x), model(x))


def test_a_context_without_a_backend_lowers_every_op_to_aten(tmp_path):
    program = trace_function(lambda x: torch.relu(x) + 1, (torch.randn(2, 3),))
    ctx = Context(program=program, target=Target(device="cpu"), backend=None, dest=tmp_path)
    lowered = run_passes(ctx, program, PASSES[:3])
    low = lowered.entries["forward"]
    assert not low.lowered and sum(low.fallback.values()) == 2
    with_cpp = replace(ctx, backend=backend_for(Target(device="cpu"), codegen=True))
    low = run_passes(with_cpp, program, PASSES[:3]).entries["forward"]
    assert sum(low.lowered.values()) == 2 and not low.fallback
