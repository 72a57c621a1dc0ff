"""The C++ front end on CUDA artifacts (format >= 14: runner files with kernel launches).

Without a GPU: every launch spec and runner file is checked before the driver is touched, so a
malformed or mismatched one is refused with an ArtifactError on any host (and a sound artifact
with a TargetError naming the missing driver). On a GPU (marked `gpu`): the sample program runs
the cubins and matches Python's `aotc.load`, with CUDA graphs and without; graph replays check
indices; a generator decodes through graphs from C++ with Python's tokens.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import aotc
from aotc.artifact import format as fmt
from conftest import replace_file, run_cpp, run_generate

FIXTURE = Path(__file__).parent / "fixtures" / "format_v14_cuda.aotc"
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def needs_gpu(fn):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(),
                                              reason="needs a CUDA GPU")(fn))


@pytest.fixture
def cuda_copy(tmp_path) -> Path:
    dest = tmp_path / "cuda.aotc"
    shutil.copytree(FIXTURE, dest)
    return dest


def _edit_json(art: Path, rel: str, edit) -> None:
    doc = json.loads((art / rel).read_text())
    edit(doc)
    replace_file(art, rel, fmt.dumps(doc))


def _refused(aotc_run, art: Path, code: int, *needles: str) -> str:
    done, _ = run_cpp(aotc_run, art)
    assert done.returncode == code, done.stderr
    for n in needles:
        assert n in done.stderr, done.stderr
    return done.stderr


SPEC = "kernels/kernel0.json"


@pytest.mark.parametrize("edit,needles", [
    (lambda d: d.update(extra=1), ["field extra", "no such field"]),
    (lambda d: d["params"][0].update(type="*fp128"), ["params[0].type", "a pointer"]),
    (lambda d: d["archs"]["sm_90"].update(cubin="kernels/../manifest.json"),
     ["archs.sm_90.cubin", "kernels/kernel0.sm_90.cubin"]),
    (lambda d: d["archs"]["sm_90"]["params"].pop(0), ["archs.sm_90.params", "pointers"]),
    (lambda d: d["archs"]["sm_90"].update(num_warps=3), ["num_warps", "one of 1, 2, 4"]),
    (lambda d: d.update(inputs=["nope"]), ["inputs", "names of the kernel's parameters"]),
    (lambda d: d["archs"].update(sm_x={}), ["archs.sm_x", "arch name"]),
    (lambda d: d.update(error_code=0), ["error_code"]),
], ids=["unknown-field", "param-type", "cubin-elsewhere", "param-count", "warps", "inputs",
        "arch-name", "error-code"])
def test_malformed_launch_specs_are_refused_before_the_gpu(aotc_run, cuda_copy, edit, needles):
    _edit_json(cuda_copy, SPEC, edit)
    _refused(aotc_run, cuda_copy, 5, "ArtifactError", SPEC, *needles)


def test_a_step_must_match_its_launch_spec(aotc_run, cuda_copy):
    """A runner file that passes a kernel other buffers, or another error code, than its
    launch spec declares never reaches the GPU."""
    rel = fmt.runner_file("forward")

    def edit(doc):
        step = next(s for s in doc["steps"] if s[0] == "kernel")
        step[7][1] = 3   # an error code the kernel does not store
    _edit_json(cuda_copy, rel, edit)
    _refused(aotc_run, cuda_copy, 5, "ArtifactError", "arguments its launch spec does not declare",
             "error code 3")


def test_a_kernel_step_needs_its_launch(aotc_run, cuda_copy):
    rel = fmt.runner_file("forward")

    def edit(doc):
        step = next(s for s in doc["steps"] if s[0] == "kernel")
        step[7][0] = [1, 1]
    _edit_json(cuda_copy, rel, edit)
    _refused(aotc_run, cuda_copy, 5, "ArtifactError", "three grid dims")


def test_a_cpu_artifact_step_with_a_launch_is_refused(aotc_run, mlp_artifact, tmp_path):
    art = tmp_path / "mlp.aotc"
    shutil.copytree(mlp_artifact, art)
    rel = fmt.runner_file("forward")

    def edit(doc):
        step = next(s for s in doc["steps"] if s[0] == "kernel")
        step.append([[1, 1, 1], 0])
    _edit_json(art, rel, edit)
    _refused(aotc_run, art, 5, "ArtifactError", "carries a launch")


def test_the_guards_name_the_artifacts_device(aotc_run, cuda_copy):
    _edit_json(cuda_copy, fmt.runner_file("forward"), lambda d: d["guards"].update(device="cpu"))
    _refused(aotc_run, cuda_copy, 5, "ArtifactError", "guards.device", '"cuda"')


@needs_gpu
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_cuda_artifacts_run_from_cpp(aotc_run, tmp_path, name):
    from conftest import SAMPLES, eager
    torch.manual_seed(0)
    model = SAMPLES[name].build().eval()
    x = torch.randn(4, 64) if name == "mlp" else torch.randn(1, 16, 128)
    art = aotc.export(model, (x,), tmp_path / f"{name}.aotc", target="cuda")
    want = aotc.load(art, cuda_graph=False).run_flat("forward", (x.cuda(),))
    ref = torch.utils._pytree.tree_leaves(eager(model, (x,)))   # a tensor, tuple or dict
    for mode, status in (("on", "graph graph"), ("off", "graph off")):
        done, outs = run_cpp(aotc_run, art, (x,), tmp_path, flags=[f"--cuda-graph={mode}"])
        assert done.returncode == 0, done.stderr
        for got, r in zip(outs, want, strict=True):   # a replay is checked bitwise at capture
            torch.testing.assert_close(got, r.cpu(), rtol=0, atol=0)
        torch.testing.assert_close(outs[0], ref[0], rtol=1e-4, atol=1e-4)
        assert "level sm_" in done.stdout and status in done.stdout, done.stdout


@needs_gpu
def test_cpp_graph_replays_check_indices(aotc_run, tmp_path):
    """An index out of range inside a CUDA graph replay is the plain run's GuardError (the
    kernels' error flag is read after each replay)."""
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 8)).eval()
    ids = torch.randint(0, 50, (2, 5))
    art = aotc.export(model, (ids,), tmp_path / "emb.aotc", target="cuda")
    done, _ = run_cpp(aotc_run, art, (ids,), tmp_path, flags=["--cuda-graph=on"])
    assert done.returncode == 0 and "graph graph" in done.stdout, done.stderr + done.stdout
    done, _ = run_cpp(aotc_run, art, (ids + 50,), tmp_path, flags=["--cuda-graph=on"])
    assert done.returncode == 6, done.stderr
    assert "GuardError" in done.stderr and "index is out of range" in done.stderr


@needs_gpu
def test_cpp_generation_replays_decode_graphs(cpp_tests, tmp_path):
    """A generator on a GPU from C++: decode replays a CUDA graph (its KV cache restored after
    the capture's trial runs, so the call that captures updates it once); the tokens equal
    Python's, with graphs and without."""
    from safetensors.torch import save_file
    from conftest import llama_sample
    model = llama_sample()
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    art = aotc.export(model, (ids,), tmp_path / "llama.aotc", decode=True, max_cache_len=64,
                      target="cuda")
    save_file({"0": ids}, tmp_path / "ids.safetensors")
    want = aotc.load(art).generate(ids.cuda(), 12)[:, 9:].cpu()
    for flag, status in (([], "graph decode: graph"), (["--no-cuda-graph"], "graph decode: off")):
        done, got = run_generate(cpp_tests, art, tmp_path / "ids.safetensors", 12, flag)
        assert done.returncode == 0, done.stderr
        assert torch.equal(got, want), (flag, got, want)
        assert status in done.stderr, done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU host runs it")
def test_an_extern_only_cuda_artifact_checks_the_driver_too(aotc_run, tmp_path):
    """No kernels to load, but the weights go to a GPU: a missing driver is a TargetError
    before any of them is copied."""
    from conftest import SAMPLES
    art = aotc.export(SAMPLES["mlp"].build(), (torch.randn(4, 64),), tmp_path / "m.aotc",
                      target="cuda", codegen=False)
    assert (art / fmt.runner_file("forward")).is_file()
    _refused(aotc_run, art, 7, "TargetError", "libcuda.so.1")
