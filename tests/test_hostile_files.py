"""Hostile artifacts, part 2: files. Paths that leave the artifact, symlinks, weights headers
that lie, files swapped after the check, and a path re-exported and loaded again in one process.
"""
from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
import torch

import aotc
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from conftest import LIBRARY, SAMPLES
from hostile import assert_refused, copy_artifact, edit_json, rehash, tensor_file


@pytest.mark.parametrize("path", ["../outside.bin", "/etc/passwd", "plans/../../outside.bin",
                                  "./weights.safetensors", "plans//forward.json",
                                  ".hidden", "kernels/\nx", "a/b/c/d/e/f"])
def test_file_paths_outside_the_artifact_are_refused(mlp_artifact, tmp_path, path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    (tmp_path / "outside.bin").write_bytes(b"secret")
    edit_json(art, fmt.MANIFEST, lambda m: m["files"].update(
        {path: {"sha256": "0" * 64, "size": 6}}))
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    assert "files" in err.where
    assert "passwd" not in str(err.found) or "root:" not in str(err)


@pytest.mark.parametrize("rel", [fmt.WEIGHTS, fmt.plan_file("forward"), LIBRARY,
                                 "kernels"])
def test_symlinks_are_refused_even_with_matching_hashes(mlp_artifact, tmp_path, rel):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    target = tmp_path / "elsewhere"
    shutil.move(art / rel, target)
    os.symlink(target, art / rel)
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    assert "symlink" in err.expected or "link" in err.fix


def test_a_fifo_in_place_of_a_file_does_not_block(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    os.unlink(art / fmt.SAMPLE_OUTPUTS)
    os.mkfifo(art / fmt.SAMPLE_OUTPUTS)
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError)
    assert "regular file" in err.what


def _weights_with_header(art, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    (art / fmt.WEIGHTS).write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    rehash(art)


@pytest.mark.parametrize("case", ["length 2**64", "overlap", "negative", "past the end",
                                  "short", "dtype", "float16 for float32"])
def test_weights_headers_that_lie_are_refused(mlp_artifact, tmp_path, case):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    from aotc.artifact.weights import read_header
    data = (art / fmt.WEIGHTS).read_bytes()
    start, header = read_header(data, "w")
    entries = {k: {"dtype": {torch.float32: "F32"}[d], "shape": list(s), "data_offsets": [lo, hi]}
               for k, (d, s, lo, hi) in header.items()}
    body = data[start:]
    name = "fc1.bias"
    if case == "length 2**64":
        (art / fmt.WEIGHTS).write_bytes(struct.pack("<Q", 2**64 - 1) + data[8:])
        rehash(art)
    else:
        if case == "overlap":
            other = entries["fc2.bias"]["data_offsets"]
            entries[name]["data_offsets"] = [other[0], other[0] + 256 * 4]
        elif case == "negative":
            entries[name]["data_offsets"] = [-8, 256 * 4 - 8]
        elif case == "past the end":
            entries[name]["data_offsets"] = [len(body) - 4, len(body) - 4 + 256 * 4]
        elif case == "short":
            entries[name]["shape"] = [512]
        elif case == "dtype":
            entries[name]["dtype"] = "PICKLE"
        elif case == "float16 for float32":
            lo = entries[name]["data_offsets"][0]
            entries[name].update(dtype="F16", data_offsets=[lo, lo + 256 * 2])
        _weights_with_header(art, entries, body)
    assert_refused(art, tmp_path / "PWNED", ArtifactError)


def test_bytes_swapped_after_the_check_are_never_used(exported, tmp_path, monkeypatch):
    """A file replaced on disk right after its hash was checked (the window between checking
    and opening again, which no longer exists): the module uses the verified bytes."""
    from aotc.artifact.hashing import Checker
    ex = exported("mlp")
    art = copy_artifact(ex.path, tmp_path / "a.aotc")
    check_all = Checker.check_all
    evil = {k: torch.zeros_like(v) for k, v in
            aotc.load(art).weights.items() if k in ("fc1.weight", "fc1.bias", "fc2.weight",
                                                    "fc2.bias", "norm.weight", "norm.bias",
                                                    "head.weight", "head.bias")}

    calls, listed = [], len(json.loads((art / fmt.MANIFEST).read_bytes())["files"])

    def hash_then_swap(self, data, pool=None):
        check_all(self, data, pool)
        calls.append(1)
        if len(calls) < listed:    # swap once every file has been checked
            return
        for rel, content in ((fmt.WEIGHTS, tensor_file(evil)),
                             (fmt.plan_file("forward"), b"{}"), (LIBRARY, b"\0" * 64)):
            new = art / (rel + ".new")
            new.write_bytes(content)
            os.replace(new, art / rel)    # a new file under the checked name
    monkeypatch.setattr(Checker, "check_all", hash_then_swap)
    m = aotc.load(art)
    with torch.no_grad():
        want = ex.model(*ex.inputs)
    torch.testing.assert_close(m(*ex.inputs), want, rtol=1e-5, atol=1e-5)


def test_reexport_to_the_same_path_loads_the_new_kernels(tmp_path):
    """Re-exporting to a path and loading it again in the same process runs the new kernels
    (dlopen of a reused name would hand back the old library)."""
    path = tmp_path / "m.aotc"
    x = torch.randn(4, 16)
    first = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    second = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Softmax(-1))
    aotc.export(first, (x,), path)
    m1 = aotc.load(path)
    out1 = m1(x)
    aotc.export(second, (x,), path)
    m2 = aotc.load(path)
    with torch.no_grad():
        torch.testing.assert_close(m2(x), second(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m1(x), out1)     # the old module keeps its own kernels
        torch.testing.assert_close(m1(x), first(x), rtol=1e-5, atol=1e-5)


def _kernel_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("aotc-kernels" in line or "aotc-lib-" in line for line in f)


def test_libraries_are_released_with_their_last_module(mlp_artifact):
    import gc
    gc.collect()
    before = _kernel_mappings()
    x = torch.randn(32, 64)
    for _ in range(20):
        aotc.load(mlp_artifact)(x)
    gc.collect()
    assert _kernel_mappings() <= before + 5


def test_unlisted_files_are_never_opened(mlp_artifact, tmp_path):
    art = copy_artifact(mlp_artifact, tmp_path / "a.aotc")
    os.mkfifo(art / "unlisted.pipe")       # opening it would block
    (art / "plans" / "backward.json").write_text("{not json")
    m = aotc.load(art)
    m(*m.random_inputs())


def test_no_codegen_artifact_runs_no_host_code_of_its_own(tmp_path):
    """An extern-only artifact with a library slipped in (listed, hashed) never loads it:
    its target names no native code, and plans call only ops of the table."""
    model = SAMPLES["mlp"].build()
    path = aotc.export(model, SAMPLES["mlp"].inputs(0), tmp_path / "x.aotc", codegen=False)
    lib = path / LIBRARY
    lib.parent.mkdir(exist_ok=True)
    lib.write_bytes(b"\x7fELF" + b"\0" * 60)
    manifest = json.loads((path / fmt.MANIFEST).read_bytes())
    manifest["files"][LIBRARY] = {"sha256": "0" * 64, "size": 64}
    from hostile import write_manifest
    write_manifest(path, manifest)
    rehash(path)
    assert aotc.load(path).library is None
