"""Hostile training artifacts: a damaged forward or backward plan fails with the typed error an
inference plan's failure gets, and counts in the manifest's `training` that disagree with its
entries are refused at load (found by scripts/fuzz_artifact.py once it ran backward too)."""
from __future__ import annotations

import json

import pytest
import torch

import aotc
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from conftest import read_raw_manifest, write_manifest
from hostile import copy_artifact, edit_json


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from aotc.api import export_file
    from aotc.exporter.specs import parse_input_specs
    from conftest import SAMPLES_DIR
    return export_file(f"{SAMPLES_DIR}/mlp.py:Net", parse_input_specs(["32x64"]),
                       tmp_path_factory.mktemp("train") / "t.aotc", train=True)


def _view(plan: dict) -> dict:
    return next(s for s in plan["steps"] if s["kind"] == "view" and s["op"].startswith(
        "aten::view"))


def _break_a_view(art, entry: str) -> None:
    """Make the first reshape of `entry`'s plan ask for one element too many."""
    def edit(p):
        shape = _view(p)["args"][1]
        shape[0] = shape[0] + 1
    edit_json(art, fmt.plan_file(entry), edit)


@pytest.mark.parametrize("runner", ["python", "cpp"])
@pytest.mark.parametrize("entry", ["forward", "backward"])
def test_a_failing_plan_is_an_artifact_error_naming_it(trained, tmp_path, entry, runner):
    art = copy_artifact(trained, tmp_path / "a.aotc")
    _break_a_view(art, entry)
    m = aotc.load(art, runner=runner)
    with pytest.raises(ArtifactError, match=f"entry {entry} failed inside its plan") as e:
        m(*m.random_inputs()).sum().backward()
    assert e.value.where == fmt.plan_file(entry) and "RuntimeError" in e.value.found


@pytest.mark.parametrize("edits,expected", [
    ({"num_outputs": 0}, "0 flags"),
    ({"num_outputs": 0, "needs_grad": []}, "no tensor leaf"),   # the tree indexes output 0
    ({"num_outputs": 500, "needs_grad": [True] * 500}, "at most"),
    ({"needs_grad": [True, True]}, "1 flags"),
    ({"mutated": ["nowhere"]}, "names among the buffers"),
])
def test_training_counts_must_agree_with_the_entries(trained, tmp_path, edits, expected):
    art = copy_artifact(trained, tmp_path / "a.aotc")
    m = read_raw_manifest(art)
    m["training"].update(edits)
    write_manifest(art, m)
    with pytest.raises(ArtifactError) as e:
        aotc.load(art)
    assert "training" in e.value.where or "output_tree" in e.value.where
    assert expected in f"{e.value.expected} {e.value}"


def test_the_exported_counts_pass(trained):
    m = json.loads((trained / fmt.MANIFEST).read_bytes())["training"]
    assert m["num_outputs"] == len(m["needs_grad"]) == 1
    out = aotc.load(trained)(torch.randn(32, 64))
    out.sum().backward()
