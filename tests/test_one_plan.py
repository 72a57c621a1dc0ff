"""One plan (issue 45 item 3): a runner file is what its typed plan derives, and Python refuses
one that is not, before anything runs (runtime/runner_file.py check_runner_files)."""
from __future__ import annotations

from pathlib import Path

import pytest

import aotc
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from aotc.artifact.reader import Artifact
from aotc.runtime.runner_file import checked_plans, runner_files
from conftest import run_aotc
from hostile import copy_artifact, edit_json

FIXTURES = Path(__file__).parent / "fixtures"
RUNNER = fmt.runner_file("forward")


def _refused(path: Path) -> ArtifactError:
    with pytest.raises(ArtifactError) as info:
        aotc.load(path)
    e = info.value
    assert e.where == RUNNER and e.expected == "the program derived from plans/forward.json"
    assert e.fix == "re-export; the runner file does not match its plan"
    return e


def _swap_fc1_for_fc2(doc):
    for w in doc["weights"]:
        if w[1] == "fc1.weight":
            w[1] = "fc2.weight"
            return
    raise AssertionError("no fc1.weight in the runner file")


def test_a_runner_file_reading_another_weight_is_refused(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, RUNNER, _swap_fc1_for_fc2)
    e = _refused(art)
    assert "weights[" in e.found and "fc2.weight" in e.found and "fc1.weight" in e.found


def test_a_reordered_step_is_refused(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, RUNNER, lambda d: d["steps"].insert(0, d["steps"].pop(1)) or d)
    assert _refused(art).found.startswith("at steps[0]")


def test_an_extra_step_is_refused(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, RUNNER, lambda d: d["steps"].append(d["steps"][-1]) or d)
    assert "items where the plan derives" in _refused(art).found


def test_a_missing_or_unlisted_runner_file_is_refused(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, fmt.MANIFEST, lambda m: m["files"].pop(RUNNER) and None)
    (art / RUNNER).unlink()
    assert _refused(art).found == "no runner file"


def test_a_kwargs_order_computes_nothing_and_is_accepted(mlp_artifact, tmp_path):
    """Exports before kwargs were put in name order (format 12 and 18 fixtures' prefill) wrote
    them in codegen's order; the C++ runner binds kwargs by name."""
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, RUNNER, lambda d: None)   # other bytes (not canonical), same program
    aotc.load(art)


def test_verify_refuses_the_hostile_artifact_with_exit_5(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    assert run_aotc("verify", art).returncode == 0
    edit_json(art, RUNNER, _swap_fc1_for_fc2)
    done = run_aotc("verify", art)
    assert done.returncode == 5, done.stderr
    assert f"{RUNNER} does not match its plan" in done.stderr


def test_export_writes_what_loading_derives(mlp_artifact):
    art = Artifact(mlp_artifact)
    derived = runner_files(art.manifest, art.plans(), art.read)
    assert derived == {RUNNER: art.read(RUNNER)}


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("format_v*.aotc")))
def test_every_fixture_runner_file_matches_its_plans(fixture):
    """Older formats are held to their version's derivation (runtime/runner_file.py)."""
    art = Artifact(FIXTURES / fixture, signature_policy=False)
    checked_plans(art)
    stored = [r for r in art.manifest.files if r.startswith(fmt.RUNNER_DIR + "/")]
    assert bool(stored) == (art.version >= (10 if art.manifest.target.device.value == "cpu"
                                            else 14) and art.manifest.tensor_parallel is None)


def test_a_flipped_fold_hint_is_refused(mlp_artifact, tmp_path):
    """`fold` runs a call once at load in the C++ runner: part of the program, derived."""
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")

    def flip(doc):
        step = next(s for s in doc["steps"] if s[0] == "call" and not s[8])
        step[8] = True
    edit_json(art, RUNNER, flip)
    assert "where the plan derives false" in _refused(art).found


def test_load_leaves_garbage_collection_as_it_was(mlp_artifact, tmp_path):
    """aotc.load pauses cyclic collection while it parses (runtime/__init__.py) and resumes
    it after, also when the load fails, and leaves it off where the caller had it off."""
    import gc
    assert gc.isenabled()
    aotc.load(mlp_artifact)
    assert gc.isenabled()
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    edit_json(art, RUNNER, _swap_fc1_for_fc2)
    _refused(art)
    assert gc.isenabled()
    gc.disable()
    try:
        aotc.load(mlp_artifact)
        assert not gc.isenabled()
    finally:
        gc.enable()
