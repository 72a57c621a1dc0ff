"""Helpers for the hostile-artifact corpus: edit an artifact as a hostile producer would (and
recompute every sha256 the manifest holds, since they are unkeyed), then try to load and run it.

Payloads try to create a marker file; a test passes only if loading raises the typed error it
names and the marker never appears.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import torch

import aotc
from aotc.errors import AotcError
from aotc.artifact import format as fmt


def payloads(marker: Path) -> list[str]:
    m = str(marker)
    return [f"__import__('os').system('touch {m}')",
            f"open({m!r}, 'w')",
            f"ｅｘｅｃ(\"open({m!r}, 'w')\")",          # fullwidth: NFKC-normalises to exec
            f"x); __import__('os').system('touch {m}'); (",
            f"exec\n__import__('os').system('touch {m}')"]


def copy_artifact(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def rehash(path: Path) -> None:
    """Recompute the manifest's file table and self-hash from what is on disk (files that are
    listed and still regular files), as a hostile producer can."""
    manifest = json.loads((path / fmt.MANIFEST).read_bytes())
    for rel in list(manifest["files"]):
        p = path / rel
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(),
                                      "size": len(data)}
    write_manifest(path, manifest)


def write_manifest(path: Path, manifest: dict) -> None:
    manifest = {k: v for k, v in manifest.items() if k != fmt.SELF_HASH_KEY}
    manifest[fmt.SELF_HASH_KEY] = hashlib.sha256(fmt.dumps(manifest)).hexdigest()
    (path / fmt.MANIFEST).write_bytes(fmt.dumps(manifest))


def edit_json(path: Path, rel: str, fn) -> None:
    """Apply `fn` to the JSON of file `rel` (in place), write it back, re-hash the artifact."""
    doc = json.loads((path / rel).read_bytes())
    out = fn(doc)
    doc = doc if out is None else out
    if rel == fmt.MANIFEST:
        write_manifest(path, doc)
    else:
        (path / rel).write_bytes(json.dumps(doc).encode())
        rehash(path)
    if rel == fmt.MANIFEST or rel.startswith("plans/"):
        rederive(path)


def rederive(path: Path) -> None:
    """Write the runner files the (edited) plans derive, as a hostile producer can, so that
    what is tested is the plan's edit, not a runner file left behind (runtime/runner_file.py);
    plans that do not parse keep their runner files (loading refuses the plan first)."""
    from aotc.artifact.reader import Artifact
    from aotc.runtime.runner_file import runner_files
    try:
        art = Artifact(path, signature_policy=False)
        try:
            files = runner_files(art.manifest, {n: art.plan(n) for n in art.manifest.entries},
                                 art.read)
        finally:
            art.close()
    except AotcError:
        return
    for rel, data in files.items():
        (path / rel).write_bytes(data)
    rehash(path)


def load_and_run(path: Path, **kwargs):
    """Load the artifact and call it on inputs of the recorded shapes; returns the outputs."""
    m = aotc.load(path, **kwargs)
    inputs = m.random_inputs()
    return m(*inputs)


# tests/test_hostile_parity.py sets this to samples/cpp's aotc_run: each refusal is then held
# against the C++ front end's verdict on the same artifact (the same error class).
CPP_FRONT_END: Path | None = None


def cpp_verdict(path: Path) -> str:
    """What the C++ front end makes of `path`: "accepted" (it loads; running it needs no entry
    called forward), or the class of the error it exits with."""
    done = subprocess.run([str(CPP_FRONT_END), str(path)], capture_output=True, text=True,
                          timeout=300)
    kind = done.stderr.split(":")[0]
    if done.returncode == 0 or (kind == "UsageError" and "has no entry forward" in done.stderr):
        return "accepted"
    return kind if done.returncode in (2, 5, 6, 7) else f"untyped (exit {done.returncode}): " \
        + done.stderr[-300:]


def assert_same_verdict(path: Path, marker: Path, error: AotcError | None) -> None:
    if CPP_FRONT_END is None:
        return
    want = "accepted" if error is None else type(error).__name__
    got = cpp_verdict(path)
    assert not marker.exists(), "a payload ran in the C++ front end"
    assert got == want, f"Python: {want}, C++: {got}"


def assert_refused(path: Path, marker: Path, error=AotcError, **kwargs) -> AotcError:
    """Loading (and calling) `path` raises `error`, and the payload's marker never appears."""
    try:
        load_and_run(path, **kwargs)
    except error as e:
        assert not marker.exists(), "a payload ran"
        assert str(e), "an error without a message"
        if not kwargs:
            assert_same_verdict(path, marker, e)
        return e
    except Exception as e:   # noqa: BLE001 - an untyped error is the failure we look for
        raise AssertionError(f"untyped {type(e).__name__}: {e}") from e
    finally:
        assert not marker.exists(), "a payload ran"
    raise AssertionError("the hostile artifact loaded and ran")


def tensor_file(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save
    return save(tensors)
