"""Hostile plans that shrink a buffer a C++ kernel indexes (format >= 17, codegen/cpp/room.py).

The plan says how large each buffer is and the runners allocate it so; a kernel indexes the
layout it was compiled for. Each kernel compares the room the runner gives each pointer with
the extent it indexes before touching memory, so such a plan is an ArtifactError naming the
slot, with either runner and the C++ front end, static or dynamic shapes, never a write past
an allocation (the crashes scripts/fuzz_artifact.py found with seeds 7 and 11).
"""
from __future__ import annotations

import json

import pytest
import torch

import aotc
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from conftest import read_raw_manifest, replace_file, run_cpp, write_manifest
from hostile import copy_artifact, edit_json

PLAN = fmt.plan_file("forward")


def _kernel_out(plan: dict, nth: int = 0) -> dict:
    steps = [s for s in plan["steps"] if s["kind"] == "kernel"]
    return plan["slots"][steps[nth]["out"][0]]


def _shrink(slot: dict) -> None:
    slot["shape"] = [1] * len(slot["shape"])
    slot["stride"] = [1] * len(slot["stride"])
    slot["contiguous"] = True


@pytest.fixture(scope="module")
def dynamic_artifact(tmp_path_factory):
    from aotc.api import export_file
    from aotc.exporter.specs import parse_input_specs
    from conftest import SAMPLES_DIR
    return export_file(f"{SAMPLES_DIR}/transformer.py:Net",
                       parse_input_specs(["batch=2[1..8]xseq=16[2..128]x128"]),
                       tmp_path_factory.mktemp("dyn") / "d.aotc")


@pytest.mark.parametrize("runner", ["python", "cpp"])
@pytest.mark.parametrize("nth", [0, 1])
def test_a_shrunk_kernel_output_is_refused_by_the_kernel(mlp_artifact, tmp_path, runner, nth):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    plan = json.loads((art / PLAN).read_bytes())
    slot, shape = _kernel_out(plan, nth)["id"], _kernel_out(plan, nth)["shape"]
    edit_json(art, PLAN, lambda p: _shrink(_kernel_out(p, nth)))
    m = aotc.load(art, runner=runner)
    x = torch.randn(*m.manifest.entries["forward"].inputs[0].shape)
    with pytest.raises(ArtifactError, match=f"writes more of slot {slot} than the plan") as e:
        m(x)
    # the extent the kernel was compiled for: the slot's elements before the plan shrank it
    assert e.value.found == "1 elements" and f"slot {slot}" in e.value.where
    assert e.value.expected == f"room for {__import__('math').prod(shape)} elements"


@pytest.mark.parametrize("runner", ["python", "cpp"])
def test_dynamic_shapes_are_checked_per_call(dynamic_artifact, tmp_path, runner):
    art = copy_artifact(dynamic_artifact, tmp_path / "a.aotc")
    edit_json(art, PLAN, lambda p: _shrink(_kernel_out(p)))
    m = aotc.load(art, runner=runner)
    for batch, seq in ((1, 2), (3, 40)):   # a shortfall whatever the sizes
        with pytest.raises(ArtifactError, match="more of slot") as e:
            m(torch.randn(batch, seq, 128))
        assert e.value.found == "1 elements"


def test_a_genuine_dynamic_plan_passes_its_room_checks(dynamic_artifact):
    m, py = aotc.load(dynamic_artifact, runner="cpp"), aotc.load(dynamic_artifact, runner="python")
    for batch, seq in ((1, 2), (8, 128), (3, 17)):
        x = torch.randn(batch, seq, 128)
        torch.testing.assert_close(m(x), py(x), rtol=1e-5, atol=1e-5)


def test_a_manifest_claiming_no_kernel_table_keeps_the_checks(mlp_artifact, tmp_path):
    # format <= 4 libraries had no table; a manifest saying so must not skip the room check
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, PLAN, lambda p: _shrink(_kernel_out(p)))
    m = read_raw_manifest(art)
    m["target"]["native"]["table"] = False
    write_manifest(art, m)
    try:
        loaded = aotc.load(art, runner="python")
    except ArtifactError:
        return   # refused at load: as good
    with pytest.raises(ArtifactError, match="more of slot"):
        loaded(torch.randn(*loaded.manifest.entries["forward"].inputs[0].shape))


def test_a_slot_claimed_as_a_kernels_but_bound_by_a_call_is_refused(mlp_artifact, tmp_path):
    # the runners check a value no kernel wrote before a kernel reads it: a plan must not
    # hide an ATen result behind the kernel producer
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")

    def edit(p):
        step = next(s for s in p["steps"] if s["kind"] in ("extern", "view"))
        p["slots"][step["out"][0]]["producer"] = "kernel"
    edit_json(art, PLAN, edit)
    with pytest.raises(ArtifactError, match="producer is 'kernel'"):
        aotc.load(art)


def test_the_cpp_front_end_refuses_a_shrunk_kernel_output(aotc_run, mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    rel = fmt.runner_file("forward")
    doc = json.loads((art / rel).read_bytes())
    out = next(s for s in doc["steps"] if s[0] == "kernel")[5][0]   # (slot, dtype, shape, ...)
    out[2], out[3] = [1] * len(out[2]), [1] * len(out[3])
    replace_file(art, rel, fmt.dumps(doc))
    done, _ = run_cpp(aotc_run, art)
    assert done.returncode == 5, done.stderr
    assert f"writes more of slot {out[0]} than the plan gives it" in done.stderr
    assert "found: 1 elements" in done.stderr
