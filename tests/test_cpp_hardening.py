"""What both front ends refuse since issue 45, held against the C++ front end (`aotc_run`,
samples/cpp) and Python's `aotc.load` on the same hostile artifacts: sizes from an artifact
checked before anything is allocated (a generator's state), CPU levels as the manifest schema
reads them, unknown runner-file fields, plans that fail while they run (a typed ArtifactError,
never an ATen or overflow message), package members that collide as file and folder, a FIFO
passed to swap-weights. Trust policies and keys: tests/test_cpp_trust.py.

The artifacts are copies of the stored format fixtures (no export), edited and re-hashed as a
hostile producer can (tests/hostile.py).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import aotc
from aotc import errors
from aotc.errors import AotcError, ArtifactError, UsageError
from aotc.artifact import format as fmt
from conftest import run_cpp
from hostile import copy_artifact, edit_json, rehash

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def cpp_verdict(aotc_run, art: Path) -> str:
    """"ok", or the class of the error aotc_run exits with (its exit code checked)."""
    done, _ = run_cpp(aotc_run, art)
    if done.returncode == 0:
        return "ok"
    kind = done.stderr.split(":")[0]
    assert kind in errors.__dict__ and done.returncode == getattr(errors, kind).exit_code, \
        done.stderr[-2000:]
    return kind


def py_verdict(art: Path, entry: str = "forward") -> str:
    try:
        m = aotc.load(art)
        m.run_flat(entry, m.random_inputs(entry))
        return "ok"
    except AotcError as e:
        return type(e).__name__


def fixture(tmp_path: Path, name: str) -> Path:
    return copy_artifact(FIXTURES / f"format_{name}.aotc", tmp_path / "a.aotc")


# ------------------------------------------------------------------ sizes before allocation
def _state(shape, runner_only=False, plans=True):
    """The second state's shape edited in the manifest (unless `runner_only`), the runner files
    and, where `plans`, the plans' state slots too (a runner file that contradicts its plan is
    refused before its state is looked at: runner_match.cpp)."""
    def edit(art: Path):
        if not runner_only:
            edit_json(art, fmt.MANIFEST, lambda m: m["state"][1].update(shape=shape))
        for entry in ("prefill", "decode"):
            slot = json.loads((art / fmt.runner_file(entry)).read_bytes())["state"][1][0]
            if plans:
                edit_json(art, fmt.plan_file(entry), lambda p: p["slots"][slot].update(
                    shape=shape, stride=_dense(shape)))
            edit_json(art, fmt.runner_file(entry), lambda r: r["state"][1].__setitem__(3, shape))
    return edit


def _dense(shape):
    out, step = [], 1
    for d in reversed(shape):
        out.insert(0, step)
        step *= max(d, 1)
    return out


STATES = {
    "1 PiB": (_state([1 << 25, 1 << 25, 1]), "state of at most"),
    "1 PiB in the runner file only": (_state([1 << 25, 1 << 25, 1], True), "is not the manifest's"),
    "negative dims": (_state([-1, 2, 4, 8], True, plans=False), "is malformed"),
    "another shape": (_state([1, 2, 4, 9], True), "is not the manifest's"),
    "the runner file against its plan": (_state([1, 2, 4, 9], True, plans=False),
                                         "does not match its plan"),
}


@pytest.mark.parametrize("case", list(STATES))
def test_runner_file_state_is_checked_before_it_is_allocated(aotc_run, tmp_path, case):
    """A generator's state: the runner file's shape must be the manifest's, and the manifest's
    state within rules.MAX_STATE_BYTES, before one byte of it is allocated (no allocator or
    ATen error: a typed refusal)."""
    edit, words = STATES[case]
    art = fixture(tmp_path, "v18_generator")
    edit(art)
    done, _ = run_cpp(aotc_run, art)
    assert done.returncode == 5 and done.stderr.startswith("ArtifactError: "), done.stderr
    assert words in done.stderr, done.stderr


def test_python_checks_the_plans_before_allocating_state(tmp_path, monkeypatch):
    """A manifest's state that the plans contradict (or no plan uses) is refused before the
    state is allocated: the allocation never happens."""
    import torch
    from aotc.runtime import module
    sizes = []
    real = torch.zeros
    monkeypatch.setattr(module.torch, "zeros", lambda *a, **k: sizes.append(a) or real(*a, **k))
    art = fixture(tmp_path, "v18_generator")
    edit_json(art, fmt.MANIFEST, lambda m: m["state"][1].update(shape=[1, 2, 4096, 8]))
    with pytest.raises(ArtifactError, match="state slots matching the manifest's state"):
        aotc.load(art)
    assert sizes == []
    edit_json(art, fmt.MANIFEST, lambda m: m["state"][1].update(shape=[1, 2, 4, 8]) or
              m["state"].append({"name": "unused", "dtype": "float32", "shape": [1 << 28]}))
    with pytest.raises(ArtifactError, match="state 'unused' is used by no plan"):
        aotc.load(art)
    assert sizes == []


def test_a_state_no_plan_uses_is_refused_by_both_front_ends(aotc_run, tmp_path):
    """1 GiB of state that no plan reads: Python refuses it before allocating (above), and the
    C++ front end, which allocates only what its runner files name, refuses it too."""
    art = fixture(tmp_path, "v18_generator")
    edit_json(art, fmt.MANIFEST, lambda m: m["state"].append(
        {"name": "unused", "dtype": "float32", "shape": [1 << 28]}))
    assert py_verdict(art, "prefill") == cpp_verdict(aotc_run, art) == "ArtifactError"
    assert "state 'unused' is used by no plan" in run_cpp(aotc_run, art)[0].stderr


# -------------------------------------------------------------------------------- CPU levels
def _libraries(edit):
    def apply(m):
        edit(m["target"]["native"]["libraries"], m["files"])
    return apply


def _add_library(level):
    def edit(libs, files):
        libs[level] = f"kernels/kernels-{level}.so"
        files[libs[level]] = files["kernels/kernels-x86-64-v2.so"]
    return edit


LEVELS = {
    "unknown level": lambda libs, files: libs.update(pentium=libs.pop("x86-64-v2")),
    "another level's file": lambda libs, files: libs.update({"x86-64-v3": libs["x86-64-v4"]}),
    "a library of no level": lambda libs, files: libs.pop("x86-64-v4"),
    "two architectures": _add_library("armv8-a"),
    "no level": lambda libs, files: libs.clear(),
}


@pytest.mark.parametrize("case", list(LEVELS))
def test_cpu_levels_are_refused_as_python_refuses_them(aotc_run, tmp_path, case):
    art = fixture(tmp_path, "v17_kernels")
    if case == "two architectures":
        shutil.copy(art / "kernels/kernels-x86-64-v2.so", art / "kernels/kernels-armv8-a.so")
    edit_json(art, fmt.MANIFEST, _libraries(LEVELS[case]))
    assert py_verdict(art) == "ArtifactError"
    assert cpp_verdict(aotc_run, art) == "ArtifactError"


# ---------------------------------------------------------------------------- runner files
def test_unknown_runner_file_field_is_refused(aotc_run, tmp_path):
    art = fixture(tmp_path, "v13_tiny")
    edit_json(art, fmt.runner_file("forward"), lambda r: r.update(extra=[1]))
    done, _ = run_cpp(aotc_run, art)
    assert done.returncode == 5, done.stderr
    assert "runner/forward.json is malformed at extra" in done.stderr
    assert 'found: "extra"' in done.stderr


def test_a_plan_failing_while_it_runs_is_an_artifact_error(aotc_run, tmp_path):
    """A runner file that passes every check but whose ATen call cannot run (addmm of a 1-d
    mat2): an ArtifactError naming the entry, not ATen's own message as exit code 1."""
    art = fixture(tmp_path, "v13_tiny")

    def edit(p):   # the plan, and so the runner file it derives (tests/hostile.py rederive)
        p["steps"][6]["args"][2] = {"slot": 2}   # addmm(b.bias, x, b.bias): mat2 is no matrix
    edit_json(art, fmt.plan_file("forward"), edit)
    assert json.loads((art / fmt.runner_file("forward")).read_bytes())["steps"][6][4][2] == \
        ["slot", 2]
    done, _ = run_cpp(aotc_run, art)
    assert done.returncode == 5, done.stderr
    assert done.stderr.startswith("ArtifactError: entry forward failed inside its plan")
    assert "where: runner/forward.json" in done.stderr and "mat2" in done.stderr


def test_plan_failures_from_the_cpp_runner_are_typed_in_python(monkeypatch):
    """An overflow of a size expression in the C++ runner reaches Python as OverflowError,
    which raise_plan_failure now turns into the ArtifactError (rules.PLAN_FAILED)."""
    from aotc.runtime import module
    assert OverflowError in module.PLAN_ERRORS

    class E:
        name, plan, guards = "forward", None, None
        spec = type("S", (), {"plan": "plans/forward.json"})
    with pytest.raises(ArtifactError, match="entry forward failed inside its plan") as err:
        module.raise_plan_failure(E, (), OverflowError("a size expression overflows 64 bits"))
    assert err.value.found == "OverflowError: a size expression overflows 64 bits"


# ---------------------------------------------------------------------------- packages, FIFO
def test_package_members_colliding_as_file_and_folder_are_refused(aotc_run, tmp_path):
    """Members "plans" and "plans/forward.json": unpacking cannot write both, so every reader
    refuses the index (Python's unpack and load, C++ reading in place)."""
    from aotc.artifact.package import pack, unpack
    art = fixture(tmp_path, "v13_tiny")
    (art / "planz").write_bytes(b"x")
    edit_json(art, fmt.MANIFEST, lambda m: m["files"].update(planz={"sha256": "0" * 64, "size": 1}))
    rehash(art)
    pkg = pack(art, tmp_path / "a.aotcpkg")
    raw = pkg.read_bytes()
    pkg.write_bytes(raw.replace(b'"planz"', b'"plans"', 1))   # the same length: the index parses
    with pytest.raises(ArtifactError, match="package member plans is both a file and a folder"):
        unpack(pkg, tmp_path / "out.aotc")
    assert not (tmp_path / "out.aotc").exists()
    done, _ = run_cpp(aotc_run, pkg)
    assert done.returncode == 5, done.stderr
    assert "package member plans is both a file and a folder" in done.stderr


def test_swap_weights_refuses_a_fifo_without_blocking(tmp_path):
    from aotc.runtime.swap import swap_weights
    art = fixture(tmp_path, "v13_tiny")
    os.mkfifo(tmp_path / "w.safetensors")
    with pytest.raises(UsageError, match="is not a regular file") as err:
        swap_weights(art, tmp_path / "w.safetensors", tmp_path / "out.aotc")
    assert err.value.found == "a FIFO"
    (tmp_path / "d.safetensors").mkdir()
    with pytest.raises(UsageError, match="is not a regular file"):
        swap_weights(art, tmp_path / "d.safetensors", tmp_path / "out.aotc")
