"""Artifact integrity, versioning, reproducibility and atomic writes."""
from __future__ import annotations

import os
import shutil
import signal
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import aotc
import aotc.artifact.shards
from aotc.cli.main import main
from aotc.cli.report import verify_artifact
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from conftest import (SAMPLES, SAMPLES_DIR, assert_matches, eager, flip_byte, read_raw_manifest,
                      replace_file, run_python, snapshot, write_manifest)

EXPECTED_FILES = {fmt.MANIFEST, fmt.WEIGHTS, fmt.plan_file("forward"), fmt.SAMPLE_INPUTS,
                  fmt.SAMPLE_OUTPUTS}


class WeightRead(BaseException):
    """Raised by the patched weight loader; a BaseException so nothing in aotc swallows it."""


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Fail the test if any weight (or sample) tensor is read from disk."""
    def forbidden(*args, **kwargs):
        raise WeightRead(f"weights tensors made with {args}")
    monkeypatch.setattr(aotc.artifact.shards, "tensors", forbidden)


def test_artifact_has_the_documented_files(mlp_artifact):
    files = set(snapshot(mlp_artifact))
    assert EXPECTED_FILES <= files
    manifest = read_raw_manifest(mlp_artifact)
    # Every file but the manifest itself is listed, with its hash: nothing escapes the check.
    assert set(manifest["files"]) == files - {fmt.MANIFEST}
    assert manifest["format_version"] == fmt.FORMAT_VERSION


def test_weight_read_patch_is_effective(artifact_copy, no_weight_reads):
    """Control for the tamper tests: on an intact artifact the patched loader IS reached."""
    with pytest.raises(WeightRead):
        aotc.load(artifact_copy)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("mask", [0xFF, 0x01])
def test_flipped_byte_in_every_file_is_refused(mlp_artifact, tmp_path, monkeypatch, where, mask):
    def forbidden(*args, **kwargs):
        raise WeightRead(f"weights read before the artifact was verified: {args}")
    monkeypatch.setattr(aotc.artifact.shards, "tensors", forbidden)
    files = sorted(snapshot(mlp_artifact))
    assert EXPECTED_FILES <= set(files)
    for rel in files:
        copy = tmp_path / f"{rel.replace('/', '_')}.aotc"
        shutil.copytree(mlp_artifact, copy)
        size = (copy / rel).stat().st_size
        offset = {"start": 0, "middle": size // 2, "end": size - 1}[where]
        flip_byte(copy / rel, offset, mask)
        with pytest.raises(ArtifactError) as info:
            aotc.load(copy)
        assert rel.split("/")[-1] in str(info.value), (rel, str(info.value))
        assert info.value.exit_code == 5


@pytest.mark.parametrize("change", ["truncate", "append"])
def test_resized_file_is_refused(artifact_copy, no_weight_reads, change):
    for rel in sorted(snapshot(artifact_copy)):
        p = artifact_copy / rel
        data = p.read_bytes()
        p.write_bytes(data[:-1] if change == "truncate" else data + b"\0")
        with pytest.raises(ArtifactError):
            aotc.load(artifact_copy)
        p.write_bytes(data)


@pytest.mark.parametrize("rel", sorted(EXPECTED_FILES))
def test_missing_file_is_refused(artifact_copy, no_weight_reads, rel):
    (artifact_copy / rel).unlink()
    with pytest.raises(ArtifactError) as info:
        aotc.load(artifact_copy)
    assert rel in str(info.value)
    assert "missing" in str(info.value)


def test_missing_directory_and_plain_file(tmp_path):
    with pytest.raises(ArtifactError, match="no artifact directory"):
        aotc.load(tmp_path / "nothing.aotc")
    f = tmp_path / "file.aotc"
    f.write_bytes(b"not a directory")
    with pytest.raises(ArtifactError, match="no artifact directory"):
        aotc.load(f)
    empty = tmp_path / "empty.aotc"
    empty.mkdir()
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        aotc.load(empty)


def test_rewriting_manifest_helper_keeps_it_valid(artifact_copy):
    """Control for the version tests: re-signing an unchanged manifest gives a loadable artifact
    with identical bytes, so a refusal below is due to the version alone."""
    before = (artifact_copy / fmt.MANIFEST).read_bytes()
    write_manifest(artifact_copy, read_raw_manifest(artifact_copy))
    assert (artifact_copy / fmt.MANIFEST).read_bytes() == before
    aotc.load(artifact_copy)


def test_newer_format_version_asks_to_upgrade(artifact_copy, no_weight_reads):
    manifest = read_raw_manifest(artifact_copy)
    manifest["format_version"] = fmt.FORMAT_VERSION + 1
    write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError) as info:
        aotc.load(artifact_copy)
    msg = str(info.value)
    assert "upgrade" in msg.lower()
    assert str(fmt.FORMAT_VERSION + 1) in msg
    assert info.value.found == fmt.FORMAT_VERSION + 1


@pytest.mark.parametrize("version", [0, "1", None])
def test_older_or_malformed_version_is_refused(artifact_copy, no_weight_reads, version):
    manifest = read_raw_manifest(artifact_copy)
    manifest["format_version"] = version
    write_manifest(artifact_copy, manifest)
    with pytest.raises(ArtifactError) as info:
        aotc.load(artifact_copy)
    assert "upgrade" not in str(info.value).lower()
    assert "re-export" in str(info.value)


def test_manifest_without_self_hash_is_refused(artifact_copy, no_weight_reads):
    manifest = read_raw_manifest(artifact_copy)
    del manifest[fmt.SELF_HASH_KEY]
    (artifact_copy / fmt.MANIFEST).write_bytes(fmt.dumps(manifest))
    with pytest.raises(ArtifactError, match=fmt.SELF_HASH_KEY):
        aotc.load(artifact_copy)


def test_reformatted_manifest_is_refused(artifact_copy, no_weight_reads):
    """Same JSON content, different bytes (e.g. re-indented by an editor): still tampering."""
    import json
    manifest = read_raw_manifest(artifact_copy)
    (artifact_copy / fmt.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    with pytest.raises(ArtifactError, match="modified"):
        aotc.load(artifact_copy)


# ---------------------------------------------------------------------------- reproducibility

def test_export_twice_is_byte_identical(exported, tmp_path):
    ex = exported("transformer")
    a = aotc.export(ex.model, ex.inputs, tmp_path / "a.aotc")
    b = aotc.export(ex.model, ex.inputs, tmp_path / "b.aotc")
    sa, sb = snapshot(a), snapshot(b)
    assert sa == sb
    assert sa == snapshot(ex.path)   # and equal to the session's earlier export


def test_export_of_freshly_built_model_is_byte_identical(tmp_path):
    sample = SAMPLES["cnn"]
    a = aotc.export(sample.build(), sample.inputs(0), tmp_path / "a.aotc")
    b = aotc.export(sample.build(), sample.inputs(0), tmp_path / "b.aotc")
    assert snapshot(a) == snapshot(b)
    c = aotc.export(sample.build(), sample.inputs(1), tmp_path / "c.aotc")
    assert snapshot(c) != snapshot(a)   # control: other samples give other bytes


# ---------------------------------------------------------------------------- overwriting

def _tree_state(path: Path) -> dict:
    return {p.relative_to(path).as_posix(): (p.is_dir(), p.read_bytes() if p.is_file() else None)
            for p in sorted(path.rglob("*"))}


def test_refuses_to_overwrite_non_artifact_directory(exported, tmp_path):
    ex = exported("mlp")
    dest = tmp_path / "precious"
    (dest / "sub").mkdir(parents=True)
    (dest / "notes.txt").write_text("do not lose me")
    (dest / "sub" / "data.bin").write_bytes(os.urandom(1000))
    before = _tree_state(dest)
    siblings = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ArtifactError, match="refusing to replace"):
        aotc.export(ex.model, ex.inputs, dest)
    assert _tree_state(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == siblings   # no temp dirs left


def test_refuses_to_overwrite_a_file(exported, tmp_path):
    ex = exported("mlp")
    dest = tmp_path / "model.aotc"
    dest.write_bytes(b"a file")
    with pytest.raises(ArtifactError):
        aotc.export(ex.model, ex.inputs, dest)
    assert dest.read_bytes() == b"a file"


def test_cli_refuses_to_overwrite_non_artifact_directory(tmp_path):
    dest = tmp_path / "precious"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep")
    before = _tree_state(dest)
    result = CliRunner().invoke(main, ["export", SAMPLES["mlp"].ref, "-i", "32x64", "-o",
                                       str(dest)])
    assert result.exit_code == 5, result.output
    assert "ArtifactError" in result.output
    assert _tree_state(dest) == before


def test_overwriting_an_artifact_replaces_it(exported, tmp_path):
    ex = exported("mlp")
    dest = tmp_path / "m.aotc"
    shutil.copytree(ex.path, dest)
    torch.manual_seed(123)
    other = type(ex.model)().eval()
    aotc.export(other, ex.inputs, dest)
    assert snapshot(dest) != snapshot(ex.path)
    x = torch.randn(32, 64)
    assert_matches(aotc.load(dest)(x), eager(other, (x,)))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "m.aotc"]
    assert leftovers == []


# ----------------------------------------------------------------------------- atomic export

KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch
    import aotc
    import aotc.artifact.publish as fmt

    victim, dest, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.path.insert(0, {samples!r})
    from mlp import Net

    def die(*args, **kwargs):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    if victim != "none":
        assert hasattr(fmt, victim), victim
        setattr(fmt, victim, die)
    torch.manual_seed(seed)
    aotc.export(Net(), (torch.randn(32, 64),), dest)
    print("EXPORT RETURNED")
""").format(samples=str(SAMPLES_DIR))


def _verifies(path: Path) -> None:
    assert "verified" in verify_artifact(aotc.load(path))
    result = CliRunner().invoke(main, ["verify", str(path)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("victim", ["fsync_tree", "swap_into_place"])
def test_killed_export_leaves_previous_artifact(exported, tmp_path, victim):
    ex = exported("mlp")
    dest = tmp_path / "model.aotc"
    shutil.copytree(ex.path, dest)
    before = snapshot(dest)
    proc = run_python(KILL_SCRIPT, victim, dest, 1)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    assert "EXPORT RETURNED" not in proc.stdout
    assert snapshot(dest) == before
    _verifies(dest)
    x = torch.randn(32, 64)
    assert_matches(aotc.load(dest)(x), eager(ex.model, (x,)))
    # A later export over the same path still works despite the debris of the killed one.
    torch.manual_seed(1)
    other = type(ex.model)().eval()
    aotc.export(other, (x,), dest)
    assert_matches(aotc.load(dest)(x), eager(other, (x,)))


def test_unkilled_export_script_does_replace(exported, tmp_path):
    """Control for the kill test: the same script, not killed, does change the artifact."""
    ex = exported("mlp")
    dest = tmp_path / "model.aotc"
    shutil.copytree(ex.path, dest)
    before = snapshot(dest)
    proc = run_python(KILL_SCRIPT, "none", dest, 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "EXPORT RETURNED" in proc.stdout
    assert snapshot(dest) != before
    _verifies(dest)
