"""Hostile artifacts, part 3: CUDA artifacts (loaded through Triton's interpreter here; the
cubin path is the same reader). Their kernels are named by the manifest, their files by the
format, and their Triton sources run only after a check that they are Triton kernels."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from conftest import SAMPLES
from hostile import assert_refused, copy_artifact, edit_json, payloads, rehash

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def cuda_mlp(tmp_path_factory):
    model = SAMPLES["mlp"].build()
    x = torch.randn(8, 64)
    return aotc.export(model, (x,), tmp_path_factory.mktemp("c") / "c.aotc", target="cuda:sm_90")


def _interp(art, marker, error=ArtifactError):
    return assert_refused(art, marker, error, device="cpu", interpret=True)


@pytest.mark.parametrize("name", ["../../x", "kernel0/../../x", "os", "__init__", "kernel0.py"])
def test_kernel_names_cannot_reach_other_files(cuda_mlp, tmp_path, name):
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    (tmp_path / "x.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w')\n")
    edit_json(art, fmt.MANIFEST, lambda m: m["target"]["native"]["kernels"].append(name))
    _interp(art, tmp_path / "PWNED")


@pytest.mark.parametrize("field,value", [("cubin", "../../evil.cubin"), ("cubin", "/etc/passwd"),
                                         ("shared", 10**12), ("num_warps", 3),
                                         ("symbol", "kernel0; x")])
def test_launch_spec_fields_are_checked(cuda_mlp, tmp_path, field, value):
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    edit_json(art, fmt.triton_launch_file("kernel0"),
              lambda s: s["archs"]["sm_90"].update({field: value}))
    err = _interp(art, tmp_path / "PWNED")
    assert "kernels/kernel0.json" in err.where and field in err.where


def test_grid_expressions_are_grammar_only(cuda_mlp, tmp_path):
    marker = tmp_path / "PWNED"
    for i, payload in enumerate(payloads(marker)):
        art = copy_artifact(cuda_mlp, tmp_path / f"a{i}.aotc")
        edit_json(art, fmt.plan_file("forward"), lambda p: next(
            s for s in p["steps"] if s["kind"] == "kernel")["launch"]["grid"].__setitem__(
                0, payload))
        _interp(art, marker)


@pytest.mark.parametrize("source", [
    "import os\nos.system('touch {m}')\n",
    "import triton\n@triton.jit\ndef kernel0(a):\n    open('{m}', 'w')\n",
    "import triton\nx = [c for c in ().__class__.__base__.__subclasses__()]\n",
    "import triton\n@triton.jit\ndef kernel0(a):\n    a.__class__\n",
    "import triton\n@print\ndef kernel0(a):\n    pass\n",
    "from os import system\n"])
def test_kernel_sources_are_checked_before_the_interpreter_runs_them(cuda_mlp, tmp_path, source):
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    marker = tmp_path / "PWNED"
    (art / fmt.triton_source_file("kernel0")).write_text(source.format(m=marker))
    rehash(art)
    err = _interp(art, marker)
    assert "kernels/kernel0.py" in err.where


def test_interpreting_writes_nothing_into_the_artifact(cuda_mlp, tmp_path):
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    before = sorted(p.relative_to(art) for p in art.rglob("*"))
    pyc = art / "kernels" / "__pycache__"
    m = aotc.load(art, device="cpu", interpret=True)
    m(*m.random_inputs())
    assert sorted(p.relative_to(art) for p in art.rglob("*")) == before
    assert not pyc.exists()


def test_a_kernel_launched_with_other_buffers_than_its_spec_is_refused(cuda_mlp, tmp_path):
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")

    def edit(p):
        k = next(s for s in p["steps"] if s["kind"] == "kernel")
        k["args"] = k["args"][:-1]
    edit_json(art, fmt.plan_file("forward"), edit)
    err = _interp(art, tmp_path / "PWNED")
    assert "launch spec" in err.what or "not bound" in err.what or "frees" in err.what


@pytest.mark.parametrize("edit", [("XBLOCK", 3), ("XBLOCK", 0), ("R0_BLOCK", -1),
                                  ("os", 4), ("XBLOCK", True), ("R0_BLOCK", 1 << 30)])
def test_block_sizes_are_powers_of_two_named_as_blocks(cuda_mlp, tmp_path, edit):
    """A launch spec's constexprs are block sizes (the interpreter runs the source with them):
    a value that is not a power of two or a name that is no block is refused at load."""
    name, value = edit
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    edit_json(art, fmt.triton_launch_file("kernel0"), lambda s: s["constexprs"].update(
        {name: value}))
    err = _interp(art, tmp_path / "PWNED")
    assert "constexprs" in err.where and name in err.where


@pytest.mark.parametrize("blocks", [{"XBLOCK": 1 << 20, "R0_BLOCK": 1 << 20},
                                    {"XBLOCK": 1 << 20}, {"R0_BLOCK": 512}, {"XBLOCK": 8}])
def test_blocks_larger_than_the_kernel_was_written_for_fail_typed(cuda_mlp, tmp_path, blocks):
    """Block sizes each within Triton's limit but larger than the ones the kernel's (maskless)
    loads and stores were written for: the interpreter would index past its buffers; the launch
    is refused before any access outside them (or Triton refuses a tile past its limit first),
    as an ArtifactError naming the kernel's source."""
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    edit_json(art, fmt.triton_launch_file("kernel0"), lambda s: s["constexprs"].update(blocks))
    err = _interp(art, tmp_path / "PWNED")
    assert "kernels/kernel0.py" in err.where
    assert "outside the tensors" in str(err) or "maximum tensor numel" in str(err)


@pytest.mark.parametrize("edit,access", [(" + 100000000, tmp7)", "writes"),
                                         (" - 1, tmp7)", "writes"),
                                         (" + 0 * tl.load(buf1 + 1 - 2), tmp7)", "reads")])
def test_kernel_sources_that_index_outside_their_buffers_are_refused(cuda_mlp, tmp_path, edit,
                                                                     access):
    """A kernel source (Triton only, so it passes the source check) whose addresses leave its
    buffers, below or above: refused before the access, naming it."""
    art = copy_artifact(cuda_mlp, tmp_path / "a.aotc")
    src = art / fmt.triton_source_file("kernel0")
    text = src.read_text()
    assert text.count(", tmp7)") == 1
    src.write_text(text.replace(", tmp7)", edit))
    rehash(art)
    err = _interp(art, tmp_path / "PWNED")
    assert f"{access} memory outside" in str(err) and "kernels/kernel0.py" in err.where
