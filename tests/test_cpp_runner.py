"""The C++ plan runner (runtime/cpp, runtime/cpp_runner.py): the same results as the Python
runner, bit for bit, on every sample; its own checks of the spec it is handed; the choice of
runner and the reasons given for it."""
from __future__ import annotations

import threading

import pytest
import torch

import aotc
from aotc.errors import ArtifactError, UsageError
from aotc.runtime.cpp_runner import runner_status
from conftest import run_aotc

RUNNER, WHY = runner_status()
needs_runner = pytest.mark.skipif(RUNNER is None, reason=f"no C++ runner here: {WHY}")


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all())
    else:
        assert a == b


@needs_runner
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "gpt2", "bert"])
def test_cpp_runner_matches_python_runner_bitwise(exported, name):
    ex = exported(name)
    cpp, py = aotc.load(ex.path), aotc.load(ex.path, runner="python")
    assert cpp.runtime == "cpp" and py.runtime == "python (asked for)"
    for seed in (0, 1):
        args = cpp.random_inputs(seed=seed)
        for a, b in zip(cpp.run_flat("forward", args), py.run_flat("forward", args)):
            _same(a, b)


@needs_runner
@pytest.mark.parametrize("name, make", [
    ("mlp", lambda: torch.randn(64, 32).t()),
    ("cnn", lambda: torch.randn(8, 3, 32, 32).contiguous(memory_format=torch.channels_last)),
    ("transformer", lambda: torch.randn(64, 2, 128).transpose(0, 1))])
def test_inputs_of_other_strides_are_laid_out_as_the_python_runner_does(exported, name, make):
    ex = exported(name)
    cpp, py = aotc.load(ex.path), aotc.load(ex.path, runner="python")
    x = make()
    assert not x.is_contiguous()
    for a, b in zip(cpp.run_flat("forward", (x,)), py.run_flat("forward", (x,))):
        _same(a, b)


@needs_runner
def test_dynamic_sizes_and_handed_over_inputs(tmp_path):
    class Net(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x.reshape(x.shape[0], -1, 4) * 3, dim=-1).sum(1)

    batch = torch.export.Dim("batch", min=1, max=16)
    path = aotc.export(Net(), (torch.randn(4, 8),), tmp_path / "d.aotc",
                       dynamic_shapes={"x": {0: batch}})
    cpp, py = aotc.load(path, runner="cpp"), aotc.load(path, runner="python")
    for n in (1, 3, 16):
        x = torch.randn(n, 8)
        _same(cpp(x), py(x))
    inputs = [torch.randn(5, 8)]
    out = cpp.entries["forward"].function(inputs, {"batch": 5})
    assert inputs == [] and out[0].shape == (5, 4)   # a list is handed over, and emptied


@needs_runner
def test_concurrent_calls(exported):
    ex = exported("mlp")
    m = aotc.load(ex.path)
    xs = [torch.randn(32, 64, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    want = [m(x) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(50):
                _same(m(xs[i]), want[i])
        except Exception as e:   # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_runner_choice_is_checked(exported):
    ex = exported("mlp")
    with pytest.raises(UsageError, match="unknown runner"):
        aotc.load(ex.path, runner="fast")
    if RUNNER is None:
        with pytest.raises(UsageError, match="cannot run"):
            aotc.load(ex.path, runner="cpp")
        assert aotc.load(ex.path).runtime.startswith("python (")


# ------------------------------------------------------------------ the runner's own checks
def _spec(**over) -> dict:
    spec = {"entry": "forward", "slots": 2, "symbols": 0, "exprs": [], "constants": [],
            "inputs": [0], "steps": [], "outputs": [(0, None)], "device": "cpu",
            "set_threads": 0}
    spec.update(over)
    return spec


def _call(op, overload, args, out=(1,), kwargs=()):
    return ("call", 0, op, overload, list(args), list(kwargs), list(out), True, False)


@needs_runner
@pytest.mark.parametrize("bad, match", [
    (_spec(inputs=[5]), "slot 5 out of range"),
    (_spec(outputs=[(2, None)]), "slot 2 out of range"),
    (_spec(exprs=[[1, 0]]), "a declared symbol"),
    (_spec(symbols=1, exprs=[[1, 0, 3]]), "two operands"),
    (_spec(exprs=[[0, 1, 0, 2]]), "exactly one value"),
    (_spec(steps=[_call("aten::relu", "default", [("slot", 9)])]), "argument index"),
    (_spec(steps=[_call("aten::relu", "default", [("slot", 0), ("slot", 0)])]),
     "at most 1 positional"),
    (_spec(steps=[_call("aten::add", "Tensor", [("slot", 0)])]), "argument other"),
    (_spec(steps=[_call("aten::relu", "default", [("slot", 0)], kwargs=[("bogus", ("i", 1))])]),
     "keyword arguments"),
    (_spec(steps=[("kernel", 0, "kernel0", 0, [], [(1, "float32", [1], [1], True, -1, False)],
                   [])]), "a kernel address"),
    (_spec(steps=[("kernel", 0, "kernel0", 1, [], [(1, "float99", [1], [1], True, -1, False)],
                   [])]), "unknown dtype"),
])
def test_runner_refuses_broken_specs(bad, match):
    with pytest.raises(RUNNER.SpecError, match=match):
        RUNNER.Program(bad)


@needs_runner
def test_runner_refuses_what_it_cannot_run():
    with pytest.raises(RUNNER.Unsupported, match="not in this torch's dispatcher"):
        RUNNER.Program(_spec(steps=[_call("aten::no_such_op", "default", [("slot", 0)])]))
    args = [(1, "float32", [1], [1], True, -1, False)] * 129
    with pytest.raises(RUNNER.Unsupported, match="more than 128"):
        RUNNER.Program(_spec(slots=2, steps=[("kernel", 0, "kernel0", 1, [], args, [])]))


@needs_runner
@pytest.mark.parametrize("a, b", [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 5)])
def test_size_expressions_use_python_floor_semantics(a, b):
    # scalar_tensor(s0 // s1) and scalar_tensor(s0 % s1): the runner's bytecode against Python
    for code, want in (([1, 0, 1, 1, 6], a // b), ([1, 0, 1, 1, 7], a % b)):
        p = RUNNER.Program(_spec(symbols=2, exprs=[code], inputs=[],
                                 steps=[_call("aten::scalar_tensor", "default", [("sym", 0)],
                                              out=(0,))]))
        assert int(p.run((), [a, b])[0]) == want


@needs_runner
def test_size_overflow_and_division_by_zero_raise():
    def run(code, syms):
        p = RUNNER.Program(_spec(symbols=2, exprs=[code], inputs=[],
                                 steps=[_call("aten::scalar_tensor", "default", [("sym", 0)],
                                              out=(0,))]))
        return p.run((), syms)
    with pytest.raises(OverflowError, match="divides by zero"):
        run([1, 0, 1, 1, 6], [3, 0])
    with pytest.raises(OverflowError, match="overflows"):
        run([1, 0, 1, 1, 5], [2**62, 4])


@needs_runner
def test_a_broken_plan_is_an_artifact_error(exported, monkeypatch):
    from aotc.runtime import cpp_runner
    real = cpp_runner._Spec.as_dict
    monkeypatch.setattr(cpp_runner._Spec, "as_dict",   # (the runner's spec, not runner files')
                        lambda self: {**real(self), "inputs": [10**6]}
                        if type(self) is cpp_runner._Spec else real(self))
    with pytest.raises(ArtifactError, match="C\\+\\+ runner refuses plan forward"):
        aotc.load(exported("mlp").path)


# ---------------------------------------------------------------------- guards in C++
def _guards():
    """x: float32[batch, seq], y: int64[batch, 2*seq]; 1 <= batch <= 8, 2 <= seq <= 16,
    seq % 2 == 0."""
    from types import SimpleNamespace as NS

    from aotc.runtime.guards import Guards
    from aotc.artifact.schema import expr as ex
    syms = {"batch": NS(min=1, max=8), "seq": NS(min=2, max=16)}
    inputs = [NS(name="x", dtype="float32", shape=(ex.parse_size("batch"), ex.parse_size("seq"))),
              NS(name="y", dtype="int64", shape=(ex.parse_size("batch"),
                                                 ex.parse_size("2*seq"), 3))]
    return Guards(inputs, syms, [ex.parse_relation("seq % 2 == 0")])


def _inputs(b=2, s=4, y_seq=None, y_dtype=torch.int64, last=3):
    return (torch.randn(b, s), torch.zeros(b, 2 * s if y_seq is None else y_seq, last,
                                           dtype=y_dtype))


GUARD_CASES = {
    "valid": _inputs(), "valid, other sizes": _inputs(8, 16), "one input": _inputs()[:1],
    "not a tensor": (torch.randn(2, 4), 3), "dtype": _inputs(y_dtype=torch.int32),
    "rank": (torch.randn(2, 4, 1), _inputs()[1]), "static dim": _inputs(last=4),
    "symbol differs": (torch.randn(3, 4), _inputs()[1]), "derived": _inputs(y_seq=9),
    "range": _inputs(9, 4), "relation": _inputs(2, 5),
    "meta": (torch.randn(2, 4, device="meta"), _inputs()[1]),
    "sparse": (torch.randn(2, 4).to_sparse(), _inputs()[1]),
    "strided view": (torch.randn(4, 8)[::2, ::2], _inputs()[1]),
}


@needs_runner
@pytest.mark.parametrize("case", sorted(GUARD_CASES))
def test_cpp_guards_accept_exactly_what_python_guards_accept(case):
    from aotc.errors import GuardError
    from aotc.runtime.cpp_runner import guard_spec
    guards, args = _guards(), GUARD_CASES[case]
    checks = RUNNER.Guards(guard_spec(guards, ["batch", "seq"], torch.device("cpu")))
    # a plan returning its symbols' values: scalar_tensor(batch), scalar_tensor(seq)
    steps = [_call("aten::scalar_tensor", "default", [("sym", i)], out=(2 + i,))
             for i in range(2)]
    program = RUNNER.Program(_spec(slots=4, symbols=2, exprs=[[1, 0], [1, 1]], inputs=[0, 1],
                                   steps=steps, outputs=[(2, None), (3, None)]))
    try:
        want = guards.check(args, torch.device("cpu"))
    except (GuardError, TypeError):
        want = None
    got = program.call(checks, args, True)
    if want is None:
        assert got is None
    else:
        assert [int(t) for t in got] == [want["batch"], want["seq"]]
    if case.startswith("valid") or case in ("range", "relation", "derived"):
        # check_guards=False: the symbols only read, nothing checked
        assert [int(t) for t in program.call(checks, args, False)] == \
            [args[0].shape[0], args[0].shape[1]]


@needs_runner
def test_aten_errors_reach_python_as_torch_raises_them():
    # mm of [2] by [2]: ATen refuses, as torch.mm would, with no C++ backtrace in the message
    p = RUNNER.Program(_spec(slots=2, steps=[_call("aten::mm", "default",
                                                   [("slot", 0), ("slot", 0)])],
                             outputs=[(1, None)]))
    with pytest.raises(RuntimeError) as e:
        p.run((torch.randn(2),), [])
    assert "must be a matrix" in str(e.value) and "Exception raised from" not in str(e.value)


def test_cli_says_which_runner(cli_mlp_artifact):
    out = run_aotc("config", "--runner")
    assert out.returncode == 0 and out.stdout.startswith("cpp" if RUNNER else "python (")
    if RUNNER:   # whether the C++ front end can capture CUDA graphs, and why not
        full = run_aotc("config").stdout
        graphs = "yes" if torch.cuda.is_available() and not RUNNER.GRAPHS_MISSING else "no ("
        assert f"C++ front end CUDA graphs: {graphs}" in full, full
    shown = run_aotc("inspect", str(cli_mlp_artifact)).stdout
    assert ("runner:  cpp" if RUNNER else "runner:  python (") in shown
    ran = run_aotc("run", str(cli_mlp_artifact), "--runs", "2", "--runner", "python").stdout
    assert "runner: python (asked for)" in ran


def test_a_generator_runs_on_the_cpp_runner_in_a_fresh_process(tmp_path):
    """A serving process imports nothing of aotc's export side (aotc.nn, which registers the
    aotc:: ops with the dispatcher for capture): the C++ runner runs aotc's own ops from its
    native table, so a generator's prefill and decode both run on it, with the Python
    runner's tokens."""
    import subprocess
    import sys

    from conftest import llama_sample
    model = llama_sample()
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    path = aotc.export(model, (ids,), tmp_path / "g.aotc", decode=True, max_cache_len=48)
    want = aotc.load(path, runner="python").generate(ids, 24)
    torch.save(ids, tmp_path / "ids.pt")
    code = ("import sys, torch, aotc\n"
            "m = aotc.load(sys.argv[1])\n"
            "assert 'aotc.nn' not in sys.modules, 'the runtime imported the export side'\n"
            "print(m.runtime)\n"
            "torch.save(m.generate(torch.load(sys.argv[2]), 24), sys.argv[3])\n")
    done = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "ids.pt"),
                           str(tmp_path / "got.pt")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "cpp", done.stdout
    assert torch.equal(torch.load(tmp_path / "got.pt"), want)
