"""Hostile plans that shrink a buffer a Triton kernel indexes (format >= 19).

A CUDA artifact's kernel cannot refuse a call itself as a C++ kernel does
(tests/test_hostile_rooms.py): its launch spec says how many elements it indexes past each
pointer (`extents`), and both runners compare them with the room of each call's tensors before
the launch, at load where the sizes are static. Before this, a plan whose slot was smaller than
its kernel's buffer made the kernel write past the allocation (the process aborted under the
interpreter; on a GPU, memory of another buffer). The kernels run here through Triton's
interpreter, as on a GPU host they run from their cubins.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import aotc
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from conftest import run_cpp
from hostile import copy_artifact, edit_json

PLAN = fmt.plan_file("forward")
RUNNER = fmt.runner_file("forward")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _model() -> MLP:
    torch.manual_seed(0)
    return MLP().eval()


@pytest.fixture(scope="module")
def cuda_mlp(tmp_path_factory):
    path = tmp_path_factory.mktemp("cuda") / "mlp.aotc"
    return aotc.export(_model(), (torch.randn(8, 64),), path, target="cuda:sm_90")


@pytest.fixture(scope="module")
def cuda_dynamic(tmp_path_factory):
    path = tmp_path_factory.mktemp("cuda") / "dyn.aotc"
    batch = torch.export.Dim("batch", min=1, max=64)
    return aotc.export(_model(), (torch.randn(8, 64),), path, target="cuda:sm_90",
                       dynamic_shapes=({0: batch},))


def _kernel_steps(plan: dict) -> list:
    return [s for s in plan["steps"] if s["kind"] == "kernel"]


def _shrink_last_output(plan: dict) -> int:
    slot = plan["slots"][_kernel_steps(plan)[-1]["out"][0]]
    slot["shape"], slot["stride"] = [1] * len(slot["shape"]), [1] * len(slot["stride"])
    slot["contiguous"] = True
    return slot["id"]


def _load(path, runner):
    return aotc.load(path, device="cpu", interpret=True, runner=runner)


@pytest.mark.parametrize("runner", ["python", "cpp"])
def test_a_shrunk_kernel_output_is_refused_at_load(cuda_mlp, tmp_path, runner):
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    plan = json.loads((art / PLAN).read_bytes())
    want = math.prod(plan["slots"][_kernel_steps(plan)[-1]["out"][0]]["shape"])
    slot = []
    edit_json(art, PLAN, lambda p: slot.append(_shrink_last_output(p)))
    with pytest.raises(ArtifactError, match=f"writes more of slot {slot[0]} than the plan") as e:
        _load(art, runner)(torch.randn(8, 64))
    assert e.value.found == "1 elements" and f"slot {slot[0]}" in e.value.where
    assert e.value.expected == f"room for {want} elements"   # the kernel's compiled extent


@pytest.mark.parametrize("runner", ["python", "cpp"])
def test_dynamic_sizes_are_checked_per_call(cuda_dynamic, tmp_path, runner):
    art = copy_artifact(cuda_dynamic, tmp_path / "a.aotc")
    edit_json(art, PLAN, lambda p: [_shrink_last_output(p)] and None)
    m = _load(art, runner)
    for batch in (1, 5, 40):   # a shortfall whatever the size
        with pytest.raises(ArtifactError, match="more of slot") as e:
            m(torch.randn(batch, 64))
        assert e.value.found == "1 elements"


def test_genuine_plans_pass_with_both_runners(cuda_dynamic):
    model = _model()
    py, cpp = _load(cuda_dynamic, "python"), _load(cuda_dynamic, "cpp")
    for batch in (1, 8, 33):
        x = torch.randn(batch, 64)
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(py(x), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cpp(x), want, rtol=1e-4, atol=1e-4)


def test_launch_specs_carry_the_extents_of_their_buffers(cuda_dynamic):
    spec = json.loads((cuda_dynamic / fmt.triton_launch_file("kernel1")).read_bytes())
    assert len(spec["extents"]) == len(spec["inputs"]) + len(spec["outputs"])
    assert any(not e.isdigit() for e in spec["extents"])   # over the batch size


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.pop("extents"), "extents"),
    (lambda d: d.update(extents=d["extents"][:-1]), "items"),
    (lambda d: d.update(extents=["n_undeclared"] * len(d["extents"])), "symbol|expression"),
])
def test_a_launch_spec_without_valid_extents_is_refused(cuda_mlp, tmp_path, edit, match):
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    edit_json(art, fmt.triton_launch_file("kernel0"), lambda d: [edit(d)] and None)
    with pytest.raises(ArtifactError, match=match):
        _load(art, "python")(torch.randn(8, 64))


def test_the_cpp_front_end_refuses_runner_file_extents_unlike_the_launch_specs(
        aotc_run, cuda_mlp, tmp_path):
    """The runner file's extents (what the C++ runner checks) must be the launch spec's; both
    are checked before the driver is needed, so this runs without a GPU."""
    for i, edit in enumerate((lambda s: s[-1].__setitem__(2, [1] * len(s[-1][2])),
                              lambda s: s[-1].pop())):
        art = copy_artifact(cuda_mlp, tmp_path / f"a{i}.aotc")
        edit_json(art, RUNNER,
                  lambda d: [edit([s for s in d["steps"] if s[0] == "kernel"][0])] and None)
        done, _ = run_cpp(aotc_run, art)
        assert done.returncode != 0 and "ArtifactError" in done.stderr, done.stderr
        assert "extents" in done.stderr, done.stderr


def test_swapping_weights_into_an_older_cuda_artifact_gives_its_kernels_extents(tmp_path):
    """swap-weights writes the current format: the launch specs of an artifact from before
    format 19 get the extents export would have written (its kernel steps' slots), and the
    swapped artifact runs, checked, with either runner."""
    from safetensors.torch import save_file
    from aotc.runtime.swap import swap_weights
    src = Path(__file__).parent / "fixtures" / "format_v14_cuda.aotc"
    old = _load(src, "python")
    new = {k: torch.randn_like(v) for k, v in old.state_dict().items()}
    save_file({k: v.contiguous() for k, v in new.items()}, tmp_path / "w.safetensors")
    dest, _ = swap_weights(src, tmp_path / "w.safetensors", tmp_path / "s.aotc")
    manifest = fmt.read_manifest(dest)
    assert manifest.format_version == fmt.FORMAT_VERSION
    for name in manifest.target.native.kernels:
        spec = json.loads((dest / fmt.triton_launch_file(name)).read_bytes())
        assert len(spec["extents"]) == len(spec["inputs"]) + len(spec["outputs"])
    x = torch.randn(*manifest.entries["forward"].inputs[0].shape)
    want = _load(dest, "python")(x)
    assert not torch.equal(want, old(x))          # the new weights
    torch.testing.assert_close(_load(dest, "cpp")(x), want)


def test_the_cpp_front_end_refuses_a_launch_spec_without_extents(aotc_run, cuda_mlp, tmp_path):
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    edit_json(art, fmt.triton_launch_file("kernel0"), lambda d: [d.pop("extents")] and None)
    done, _ = run_cpp(aotc_run, art)
    assert done.returncode != 0 and "ArtifactError" in done.stderr, done.stderr
    assert "an extents member (format >= 19)" in done.stderr, done.stderr
