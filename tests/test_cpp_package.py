"""Single-file packages (`aotc pack`) in the C++ front end: `aotc::Module` reads a package in
place (its weights mapped from the package at their offsets, the kernel library from a memfd,
nothing written to disk) and gives the outputs Python's `aotc.load` of the package gives; a
damaged package is refused with the error class Python raises and, for every rule of the
layout (artifact/package.py) and of its members, the very message Python gives.

The programs are samples/cpp's aotc_run and tests/cpp's `mapped`, built once per session
(conftest.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

import aotc
from aotc.errors import AotcError
from aotc.artifact import format as fmt
from aotc.artifact.package import HEADER, _layout, pack
from conftest import LIBRARY, package_index, run_cpp

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def _members(data: bytes) -> list[tuple[str, bytes]]:
    return [(name, data[offset:offset + size]) for name, offset, size in package_index(data)[1]]


def _repacked(members: list[tuple[str, bytes]]) -> bytes:
    """A package of exactly these members, laid out by the rules (artifact/package.py)."""
    head, rows = _layout(members)
    out = bytearray(head)
    for (_, data), m in zip(members, rows):
        out += b"\0" * (m.offset - len(out)) + data
    return bytes(out)


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_a_package_gives_pythons_outputs(aotc_run, exported, tmp_path, name):
    e = exported(name)
    pkg = pack(e.path, tmp_path / f"{name}.aotcpkg")
    done, outs = run_cpp(aotc_run, pkg, e.inputs, tmp_path)
    assert done.returncode == 0, done.stderr
    want = aotc.load(pkg).run_flat("forward", e.inputs)
    _, from_dir = run_cpp(aotc_run, e.path, e.inputs, tmp_path)
    assert len(outs) == len(want) == len(from_dir)
    for got, ref, same in zip(outs, want, from_dir):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(got, same)   # the directory's bytes, the same kernels


def test_a_package_is_read_in_place(cpp_tests, packed, tmp_path):
    """Weights mapped from the package at their member's offset, the kernel library from a
    sealed memfd, no other file opened or written: it loads where the current directory is
    read-only and TMPDIR is not a directory."""
    ro, not_a_dir = tmp_path / "ro", tmp_path / "tmp-is-a-file"
    ro.mkdir()
    not_a_dir.write_bytes(b"")
    ro.chmod(0o555)
    try:
        done = subprocess.run([str(cpp_tests / "mapped"), str(packed)], capture_output=True,
                              text=True, timeout=300, cwd=ro,
                              env=dict(os.environ, TMPDIR=str(not_a_dir)))
        assert done.returncode == 0, done.stderr
        assert os.listdir(ro) == []
    finally:
        ro.chmod(0o755)
    maps = [line.split(" ", 1) for line in done.stdout.splitlines()]
    real = os.path.realpath(packed)
    weights = next(offset for name, offset, _ in package_index(packed.read_bytes())[1]
                   if name == fmt.WEIGHTS)
    assert [real, weights] in [[path, int(offset)] for offset, path in maps]
    assert any(path.startswith("/memfd:aotc-kernels") for _, path in maps), done.stdout
    beside = os.path.dirname(real) + os.sep   # no file but the package itself
    assert not [p for _, p in maps if p.startswith(beside) and p != real], done.stdout


def _edit_index(data: bytes, edit) -> bytes:
    """`data` with its index rows edited by `edit(rows)`, padded to the index's own length."""
    length, rows = package_index(data)
    edit(rows)
    index = json.dumps({"members": rows}).encode()
    assert len(index) <= length
    return data[:HEADER.size] + index.ljust(length) + data[HEADER.size + length:]


def _index_text(data: bytes, text: bytes) -> bytes:
    """`data` with `text` for its index, padded to the index's own length."""
    length, _ = package_index(data)
    assert len(text) <= length
    return data[:HEADER.size] + text.ljust(length) + data[HEADER.size + length:]


def _header(data: bytes, **fields) -> bytes:
    values = dict(zip(("magic", "layout", "zero", "length"), HEADER.unpack(data[:HEADER.size])))
    values.update(fields)
    return HEADER.pack(*values.values()) + data[HEADER.size:]


def _padded_row(rows) -> int:
    """The index of a member with padding before it."""
    return next(i for i in range(1, len(rows)) if rows[i][1] > rows[i - 1][1] + rows[i - 1][2])


def _small_row(rows) -> int:
    """The index of a member aligned to 64 bytes, not the last."""
    return next(i for i, (name, _, size) in enumerate(rows[:-1])
                if size < 4096 and not name.startswith("weights"))


def _set(data: bytes, offset: int, byte: int) -> bytes:
    return data[:offset] + bytes([byte]) + data[offset + 1:]


def _flip(data: bytes, member: str) -> bytes:
    """`data` with the middle byte of `member` flipped (changed after packing)."""
    _, offset, size = next(r for r in package_index(data)[1] if r[0] == member)
    return _set(data, offset + size // 2, data[offset + size // 2] ^ 0x10)


def _drop(data: bytes, member: str) -> bytes:
    return _repacked([(n, b) for n, b in _members(data) if n != member])


# Damage with which the C++ front end must say exactly what Python says: every rule of the
# layout, and of the members against the manifest.
SAME_MESSAGE = {
    "bad magic": lambda d: b"AOTCPKX\0" + d[8:],
    "empty file": lambda d: b"",
    "short file": lambda d: d[:20],   # the magic, then the end
    "layout version": lambda d: _header(d, layout=2),
    "reserved field": lambda d: _header(d, zero=5),
    "index past the end": lambda d: _header(d, length=1 << 40),
    "dotdot": lambda d: _edit_index(d, lambda r: r[1].__setitem__(0, "../x")),
    "nested dotdot": lambda d: _edit_index(d, lambda r: r[1].__setitem__(0, "kernels/../../x")),
    "absolute": lambda d: _edit_index(d, lambda r: r[1].__setitem__(0, "/etc/passwd")),
    "control character": lambda d: _edit_index(d, lambda r: r[1].__setitem__(0, "a\nb'")),
    "duplicate": lambda d: _edit_index(d, lambda r: r[2].__setitem__(0, r[1][0])),
    "overlap": lambda d: _edit_index(d, lambda r: r[2].__setitem__(1, r[1][1])),
    "overlaps the index": lambda d: _edit_index(d, lambda r: r[0].__setitem__(1, 8)),
    "misaligned": lambda d: _edit_index(d, lambda r: r[_small_row(r)].__setitem__(
        1, r[_small_row(r)][1] + 64)),
    "past the end": lambda d: d[:-10],
    "bad padding": lambda d: _set(d, package_index(d)[1][_padded_row(package_index(d)[1])][1] - 1, 7),
    "trailing bytes": lambda d: d + b"\0junk",
    "unlisted member": lambda d: _edit_index(d, lambda r: r[-1].__setitem__(0, "extra.bin")),
    "listed file missing": lambda d: _drop(d, fmt.runner_file("forward")),
    "no manifest": lambda d: _drop(d, fmt.MANIFEST),
    "wrong size": lambda d: _repacked([(n, b + b"\n" if n == fmt.runner_file("forward") else b)
                                       for n, b in _members(d)]),
}

# Damage where both refuse with the same class, their messages worded by their own JSON readers
# or hashers: (damage, what the C++ message says).
SAME_CLASS = {
    "index not JSON": (lambda d: _index_text(d, b'{"members": [}'),
                       "ArtifactError: package index is not valid JSON"),
    "index not an object": (lambda d: _index_text(d, b'[]'),
                            "package index is malformed at its root"),
    "index with another field": (lambda d: _index_text(d, b'{"members": [], "x": 1}'),
                                 "package index is malformed at x"),
    "index without members": (lambda d: _index_text(d, b'{}'),
                              "package index is malformed at its root"),
    "row of two": (lambda d: _edit_index(d, lambda r: r[0].pop()),
                   "package index is malformed at members[0]"),
    "offset a string": (lambda d: _edit_index(d, lambda r: r[0].__setitem__(1, "0")),
                        "package index is malformed at members[0][1]"),
    "offset a float": (lambda d: _edit_index(d, lambda r: r[0].__setitem__(1, 24.0)),
                       "package index is malformed at members[0][1]"),
    "negative size": (lambda d: _edit_index(d, lambda r: r[0].__setitem__(2, -1)),
                      "package index is malformed at members[0][2]"),
    "duplicate key": (lambda d: _index_text(d, b'{"members": [], "members": []}'),
                      "no duplicate member"),
    "weights changed": (lambda d: _flip(d, fmt.WEIGHTS),
                        "artifact file weights.safetensors is damaged ("),
    "runner file changed": (lambda d: _flip(d, fmt.runner_file("forward")),
                            "artifact file runner/forward.json is damaged ("),
    "kernel library changed": (lambda d: _flip(d, LIBRARY),
                               f"artifact file {LIBRARY} is damaged ("),
    "sample inputs changed": (lambda d: _flip(d, fmt.SAMPLE_INPUTS),   # read by no entry
                              f"artifact file {fmt.SAMPLE_INPUTS} is damaged ("),
    "manifest changed": (lambda d: _repacked(
        [(n, b.replace(b'"float32"', b'"float64"', 1) if n == fmt.MANIFEST else b)
         for n, b in _members(d)]), "manifest.json was modified after export"),
}


def _python_error(path) -> AotcError:
    with pytest.raises(AotcError) as e:
        m = aotc.load(path)
        m(*m.random_inputs())
    return e.value


@pytest.mark.parametrize("case", sorted(SAME_MESSAGE))
def test_a_damaged_package_is_refused_as_python_refuses_it(aotc_run, packed, tmp_path, case):
    bad = tmp_path / "bad.aotcpkg"
    bad.write_bytes(SAME_MESSAGE[case](packed.read_bytes()))
    python = _python_error(bad)
    done, _ = run_cpp(aotc_run, bad)
    assert done.returncode == python.exit_code == 5, done.stderr
    assert done.stderr.strip() == f"{type(python).__name__}: {python}"
    assert python.expected is not None and python.found is not None and python.fix


@pytest.mark.parametrize("case", sorted(SAME_CLASS))
def test_a_damaged_package_is_refused_with_pythons_class(aotc_run, packed, tmp_path, case):
    damage, says = SAME_CLASS[case]
    bad = tmp_path / "bad.aotcpkg"
    bad.write_bytes(damage(packed.read_bytes()))
    python = _python_error(bad)
    done, _ = run_cpp(aotc_run, bad)
    assert done.returncode == python.exit_code == 5, done.stderr
    assert done.stderr.startswith("ArtifactError: ") and says in done.stderr, done.stderr
    for label in ("where", "expected", "found", "fix"):
        assert f"\n  {label}: " in done.stderr, done.stderr


def test_a_symlink_to_a_package_is_refused(aotc_run, packed, tmp_path):
    link = tmp_path / "link.aotcpkg"
    link.symlink_to(packed)
    python = _python_error(link)
    done, _ = run_cpp(aotc_run, link)
    assert done.returncode == 5 and done.stderr.strip() == f"ArtifactError: {python}"


def test_a_signed_package_runs(aotc_run, packed, tmp_path):
    """signatures.json is a member a package may hold beside the listed files (with trusted
    keys C++ verifies it: tests/test_cpp_signing.py, test_a_signed_package_...)."""
    pytest.importorskip("cryptography")
    from aotc.artifact.signing import generate_keys, sign_artifact
    priv, _ = generate_keys(tmp_path / "k", "ed25519")
    pkg = tmp_path / "s.aotcpkg"
    pkg.write_bytes(packed.read_bytes())
    sign_artifact(pkg, priv)
    assert fmt.SIGNATURES in [name for name, _, _ in package_index(pkg.read_bytes())[1]]
    done, _ = run_cpp(aotc_run, pkg)
    assert done.returncode == 0, done.stderr
