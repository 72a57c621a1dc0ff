"""The C++ plan runner on CUDA artifacts (runtime/cpp/launch.h): Triton kernel steps.

Without a GPU, a CUDA artifact's kernels run through Triton's interpreter, and with
`runner="cpp"` the C++ runner runs the plan around them (allocations, layouts, grids, sizes,
the error flag), calling the interpreter's launchers back: the same plan and kernels as the
Python runner, so the same bits. On a GPU (tests marked `gpu`) the runner launches the cubins
itself through the driver API, eagerly and inside CUDA graphs.
"""
from __future__ import annotations

import pytest
import torch

import aotc
from conftest import SAMPLES, assert_matches, eager
from test_index_guards import Embed
from test_triton import (TARGET, cross, interpreted_accesses_stay_in_bounds,  # noqa: F401
                         needs_gpu)
from test_triton_e2e import SMALL

pytest.importorskip("triton")
from aotc.runtime.cpp_runner import runner_status  # noqa: E402

pytestmark = pytest.mark.skipif(runner_status()[0] is None, reason="no C++ runner here")

@pytest.mark.parametrize("name", ["cnn", "gpt2", "mlp"])
def test_cpp_runner_runs_triton_plans_as_the_python_runner(name, tmp_path):
    torch.manual_seed(0)
    model, inputs = SAMPLES[name].build(), SMALL[name]()
    p = aotc.export(model, inputs, tmp_path / f"{name}.aotc", target=TARGET)
    cpp = aotc.load(p, device="cpu", interpret=True, runner="cpp")
    py = aotc.load(p, device="cpu", interpret=True, runner="python")
    assert cpp.runtime == "cpp" and py.runtime.startswith("python")
    got = cpp(*inputs)
    assert_matches(got, py(*inputs), rtol=0, atol=0)
    assert_matches(got, eager(model, inputs), rtol=1e-4, atol=1e-4)


def test_cuda_training_plans_run_on_the_cpp_runner_as_on_the_python_runner(tmp_path):
    """A CUDA training artifact (forward and backward plans of Triton kernels), now that the
    C++ runner is the default on CUDA: the same output and gradients, bit for bit."""
    from test_triton_e2e import TRAIN
    torch.manual_seed(0)
    model, x = TRAIN["mlp"]()
    p = aotc.export(model, (x,), tmp_path / "t.aotc", train=True, target=TARGET)
    got = {}
    for runner in ("python", "cpp"):
        m = aotc.load(p, device="cpu", interpret=True, runner=runner)
        xa = x.clone().requires_grad_()
        out = m(xa)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        got[runner] = [out.detach(), xa.grad, *(w.grad for w in m.parameters())]
    assert all(torch.equal(a, b) for a, b in zip(got["python"], got["cpp"], strict=True))


def test_the_python_runner_stays_the_default_for_triton_kernels(tmp_path):
    model = SAMPLES["mlp"].build()
    p = aotc.export(model, SMALL["mlp"](), tmp_path / "mlp.aotc", target=TARGET)
    m = aotc.load(p, device="cpu", interpret=True)
    assert m.runtime.startswith("python (") and "runner='cpp'" in m.runtime


@pytest.fixture(scope="module")
def embed(tmp_path_factory):
    torch.manual_seed(0)
    model = Embed()
    ids = torch.randint(0, 50, (2, 5))
    p = aotc.export(model, (ids,), tmp_path_factory.mktemp("embed") / "e.aotc", target=TARGET)
    return model, ids, p


def test_an_index_a_triton_kernel_flags_raises_the_python_runners_error(embed):
    model, ids, p = embed
    bad = ids.clone()
    bad[1, 3] = 77
    said = []
    for runner in ("python", "cpp"):
        m = aotc.load(p, device="cpu", interpret=True, runner=runner)
        with pytest.raises(aotc.GuardError) as info:
            m(bad)
        said.append(str(info.value))
        torch.testing.assert_close(m(ids), eager(model, (ids,)))   # the next call is clean
    assert said[0] == said[1] and "77" in said[1]


def test_a_deferred_flag_is_kept_for_a_later_check(embed):
    """Inside a CUDA graph capture the flag cannot be read: the run keeps it (graphs.py reads
    it after each replay)."""
    _, ids, p = embed
    m = aotc.load(p, device="cpu", interpret=True, runner="cpp")
    fn = m.entries["forward"].function
    bad = ids.clone()
    bad[0, 0] = -3
    flags: list = []
    with fn.deferred_flags(flags):
        fn((bad,), {})
        fn((ids,), {})
    assert len(flags) == 2 and [int(f.item()) != 0 for f in flags] == [True, False]
    fn.check_flag(flags[1])
    with pytest.raises(aotc.GuardError, match="-3"):
        fn.check_flag(flags[0], (bad,))
    torch.testing.assert_close(fn((ids,), {})[0], m(ids))   # undeferred again


def test_a_cuda_launcher_needs_a_cuda_function(embed):
    """The runner refuses a cubin launcher without its function before anything runs."""
    from aotc.runtime import _runner
    _, _, p = embed
    m = aotc.load(p, device="cpu", interpret=True, runner="cpp")
    spec = m.entries["forward"].function._spec.as_dict()
    kernel = next(s for s in spec["steps"] if s[0] == "kernel")
    launcher = {"name": "k", "function": 0, "shared": 0, "div16_function": 0,
                "div16_shared": 0, "aligned": [], "threads": 128, "ctas": 1, "pdl": False,
                "pointers": [True], "inputs": [True], "scratch": [], "context": 0, "device": 0}
    spec["steps"] = [(*kernel[:7], (launcher, *kernel[7][1:]))]
    with pytest.raises(ValueError, match="no CUfunction"):
        _runner.Program(spec)


@needs_gpu
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_cubins_launched_by_the_cpp_runner(cross, name, graphs):  # noqa: F811
    model, x, path = cross[name]
    m = aotc.load(path, runner="cpp", cuda_graph=graphs)
    assert m.runtime == "cpp"
    want = eager(model.cuda(), (x.cuda(),))
    for _ in range(3):   # graphs: captured, then replayed
        assert_matches(m(x.cuda()), want, rtol=1e-4, atol=1e-4)
    assert_matches(m(x.cuda()), aotc.load(path, runner="python", cuda_graph=False)(x.cuda()),
                   rtol=0, atol=0)
    model.cpu()
