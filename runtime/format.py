"""The artifact format: the one module that names every file of an artifact directory.

Codegen writes artifacts through `write_artifact`; the runtime reads them through
`read_manifest`, which refuses anything damaged, tampered with or of an unknown version before a
single weight is read.

    NAME.aotc/
      manifest.json              format version, producers, target, entry points, guards, and the
                                 sha256 and size of every other file
      weights.safetensors        parameters, buffers and constants (never pickle)
      plans/<entry>.json         the launch plan of each entry point
      samples/inputs.safetensors example inputs recorded at export (for `aotc verify`)
      samples/outputs.safetensors eager outputs for those inputs
      kernels/kernels.cpp        generated C++ kernels (readable source)
      kernels/kernels.so         the same, compiled for the ISA the manifest names
      kernels/<name>.py          CUDA artifacts: one Triton kernel (readable, self-contained)
      kernels/<name>.<arch>.cubin  the same, compiled for each GPU arch the manifest names
      kernels/<name>.json        its launch spec: parameters, block sizes, grid, per-arch metadata
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from aotc.errors import ArtifactError

FORMAT_VERSION = 4
# Dated changelog: one line per version. Artifacts of every version listed here must load or be
# refused with a clear error; tests/fixtures keeps a small artifact of each. This aotc writes
# FORMAT_VERSION and reads every earlier version listed (their plans are valid plans of it).
CHANGELOG = {
    1: ("2026-11-30", "first format: manifest.json, weights.safetensors, plans/<entry>.json "
                      "with kernel/extern/view/free steps, kernels/ (C++ source and library, or Triton "
                      "sources, cubins per arch and launch metadata), samples/"),
    2: ("2026-11-30", "plans: a kernel output may have a permuted dense layout (slot "
                      "'contiguous': false, allocated with its 'stride': channels-last "
                      "activations), and a weight slot may say 'memory_format': 'channels_last' "
                      "(converted at load); a reader of version 1 would misread both"),
    3: ("2026-11-30", "Triton kernels may take their dim sizes as 'i32' parameters (32-bit "
                      "index arithmetic where the declared maxima allow it); a reader of "
                      "version 2 refuses them"),
    4: ("2026-11-30", "weights.safetensors may store a 2-d matmul weight as its [K, N] "
                      "transpose: its plan slot says 'layout': 'transposed' (logical shape "
                      "[N, K], strides [1, N]) and manifest weights.transposed lists it; a "
                      "reader of version 3 would bind it with the wrong shape"),
}
# Optional additions within a version (readers of that version ignore them; no new version):
#   2026-11-30  target.native.autotune (a summary of --autotune, or why it was skipped) and
#               kernels/<name>.json "autotune" (each kernel's timed candidates and choice)
#   2026-11-30  kernels/<name>.json archs.<arch>.div16: a second cubin of a kernel with size
#               parameters, compiled for sizes divisible by 16 (launched when they are; the
#               plain cubin, valid for every size, otherwise)

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
SAMPLE_INPUTS = "samples/inputs.safetensors"
SAMPLE_OUTPUTS = "samples/outputs.safetensors"
KERNELS_DIR = "kernels"
KERNEL_SOURCE = "kernels/kernels.cpp"
KERNEL_LIBRARY = "kernels/kernels.so"
SELF_HASH_KEY = "manifest_sha256"


def plan_file(entry: str) -> str:
    return f"plans/{entry}.json"


def triton_source_file(kernel: str) -> str:
    return f"{KERNELS_DIR}/{kernel}.py"


def triton_cubin_file(kernel: str, arch: str, variant: str | None = None) -> str:
    """A kernel's cubin for `arch`; `variant` "div16": built for sizes divisible by 16."""
    return f"{KERNELS_DIR}/{kernel}.{arch}{'.' + variant if variant else ''}.cubin"


def triton_launch_file(kernel: str) -> str:
    return f"{KERNELS_DIR}/{kernel}.json"


def dumps(obj) -> bytes:
    """Canonical JSON: sorted keys, fixed indentation, so equal content means equal bytes."""
    return (json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------- write

def write_artifact(dest: str | os.PathLike, files: dict[str, bytes], manifest: dict,
                   check=None) -> Path:
    """Write `files` plus a manifest listing their hashes, atomically, to `dest`.

    The directory is built beside `dest` and swapped into place in one rename, so a reader (or a
    killed export) sees either the previous artifact or the new one, never a mixture.
    `check(tmp)`, if given, runs on the complete temporary directory before the swap; what it
    raises aborts the write (export proves its artifact there).
    """
    dest = Path(dest).absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and not (dest / MANIFEST).is_file():
        raise ArtifactError(f"refusing to replace {dest}: it exists and is not an aotc artifact",
                            where=str(dest), expected=f"a directory holding {MANIFEST} or no file",
                            found="a file or a directory without a manifest",
                            fix="choose another output path (-o) or remove it yourself")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        entries = {}
        for rel, data in sorted(files.items()):
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            entries[rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        manifest = dict(manifest, format_version=FORMAT_VERSION, files=entries)
        manifest[SELF_HASH_KEY] = hashlib.sha256(dumps(manifest)).hexdigest()
        (tmp / MANIFEST).write_bytes(dumps(manifest))
        _fsync_tree(tmp)
        if check is not None:
            check(tmp)
        _swap_into_place(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


_RENAME_EXCHANGE = 2


def _swap_into_place(tmp: Path, dest: Path) -> None:
    """Rename tmp to dest. If dest exists, exchange the two atomically (renameat2) where the OS
    allows, so there is no moment without a complete artifact at `dest`; tmp then holds the old."""
    if not dest.exists():
        os.rename(tmp, dest)
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    at_fdcwd = -100
    if renameat2 is not None and renameat2(at_fdcwd, os.fsencode(tmp), at_fdcwd,
                                           os.fsencode(dest), _RENAME_EXCHANGE) == 0:
        return
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    os.rename(dest, old)
    os.rename(tmp, dest)
    os.rename(old, tmp)


# ------------------------------------------------------------------------------------------ read

def read_manifest(path: str | os.PathLike, *, verify_hashes: bool = True) -> dict:
    """Parse and check an artifact's manifest, and the size and sha256 of every file it lists.

    Raises ArtifactError, naming the file, for anything missing, damaged or of another version.
    """
    root = Path(path)
    mpath = root / MANIFEST
    if not root.is_dir():
        raise ArtifactError(f"no artifact directory at {root}", where=str(root),
                            expected="a directory written by `aotc export`",
                            found="nothing" if not root.exists() else "a file",
                            fix="check the path, or export the model first with `aotc export`")
    if not mpath.is_file():
        raise ArtifactError(f"{MANIFEST} is missing from {root}", where=str(mpath),
                            expected=f"{MANIFEST}", found="no such file",
                            fix="re-export the model; the artifact is incomplete")
    raw = mpath.read_bytes()
    manifest = _parse_manifest(raw, mpath)
    _check_version(manifest, mpath)
    _check_files(root, manifest, verify_hashes)
    return manifest


def _parse_manifest(raw: bytes, mpath: Path) -> dict:
    damaged = dict(where=str(mpath), fix="re-export the model; do not edit artifacts by hand")
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{MANIFEST} is damaged: not valid JSON ({e})", expected="JSON",
                            found=f"{len(raw)} bytes that do not parse", **damaged) from None
    if not isinstance(manifest, dict) or SELF_HASH_KEY not in manifest:
        raise ArtifactError(f"{MANIFEST} is damaged: no {SELF_HASH_KEY}",
                            expected=f"an object with {SELF_HASH_KEY}",
                            found=type(manifest).__name__, **damaged)
    recorded = manifest.pop(SELF_HASH_KEY)
    actual = hashlib.sha256(dumps(manifest)).hexdigest()
    manifest[SELF_HASH_KEY] = recorded
    if actual != recorded or dumps(manifest) != raw:
        raise ArtifactError(f"{MANIFEST} was modified after export (hash mismatch)",
                            expected=recorded, found=actual, **damaged)
    return manifest


def _check_version(manifest: dict, mpath: Path) -> None:
    version = manifest.get("format_version")
    if version in CHANGELOG and version <= FORMAT_VERSION:
        return
    newer = isinstance(version, int) and version > FORMAT_VERSION
    raise ArtifactError(
        f"artifact format version {version} is not supported by this aotc", where=str(mpath),
        expected=f"format version {FORMAT_VERSION} (known: {sorted(CHANGELOG)})", found=version,
        fix=("upgrade aotc to load artifacts of a newer format" if newer
             else "re-export the model with this aotc"))


def _check_files(root: Path, manifest: dict, verify_hashes: bool) -> None:
    for rel, info in sorted(manifest.get("files", {}).items()):
        p = root / rel
        if not p.is_file():
            raise ArtifactError(f"artifact file {rel} is missing", where=str(p),
                                expected=f"{info['size']} bytes", found="no such file",
                                fix="re-export the model or copy the whole artifact directory")
        size = p.stat().st_size
        if size != info["size"]:
            raise ArtifactError(f"artifact file {rel} has the wrong size (truncated or modified)",
                                where=str(p), expected=f"{info['size']} bytes",
                                found=f"{size} bytes", fix="re-export or re-copy the artifact")
        if verify_hashes:
            digest = sha256_file(p)
            if digest != info["sha256"]:
                raise ArtifactError(f"artifact file {rel} is damaged (sha256 mismatch)",
                                    where=str(p), expected=info["sha256"], found=digest,
                                    fix="re-export or re-copy the artifact")
