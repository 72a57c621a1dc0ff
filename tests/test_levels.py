"""CPU kernels for several levels (format 9): `--isa auto` builds the x86-64-v2 baseline and each
level up to the host's, the loader picks the best this CPU has (or the one `isa=` names),
`aotc inspect` lists them, `--isa LEVEL` pins one, and a cross target without its compiler is
refused with a UsageError."""
from __future__ import annotations

import shutil

import pytest
import torch

import aotc
from aotc.codegen.cpp.build import resolve_isa
from aotc.errors import TargetError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.isa import auto_levels, best_level, host_arch
from conftest import read_raw_manifest, run_aotc

pytestmark = pytest.mark.skipif(host_arch() != "x86_64", reason="x86-64 levels")


@pytest.fixture(autouse=True)
def every_level(one_cpu_level, monkeypatch):
    """`--isa auto` as shipped: every level up to the host's (conftest pins one level)."""
    from aotc.codegen.cpp import build
    monkeypatch.setattr(build, "auto_levels", one_cpu_level)


@pytest.fixture(scope="module")
def all_levels_artifact(one_cpu_level, tmp_path_factory):
    from aotc.codegen.cpp import build
    from conftest import SAMPLES
    patch = pytest.MonkeyPatch()
    patch.setattr(build, "auto_levels", one_cpu_level)
    try:
        return aotc.export(SAMPLES["mlp"].build(), SAMPLES["mlp"].inputs(0),
                           tmp_path_factory.mktemp("levels") / "mlp.aotc")
    finally:
        patch.undo()


def test_auto_carries_every_level_and_the_baseline_gives_the_same_outputs(all_levels_artifact):
    mlp_artifact = all_levels_artifact
    native = read_raw_manifest(mlp_artifact)["target"]["native"]
    assert list(native["libraries"]) == list(auto_levels())
    assert native["libraries"]["x86-64-v2"] == fmt.kernel_library("x86-64-v2")
    best = aotc.load(mlp_artifact)
    base = aotc.load(mlp_artifact, isa="x86-64-v2")
    assert best.library.level == best_level() and base.library.level == "x86-64-v2"
    x = best.random_inputs()
    # the same kernels at another level: FMA contraction may round differently
    torch.testing.assert_close(base(*x), best(*x), rtol=1e-5, atol=1e-5)


def test_a_level_the_artifact_lacks_or_that_is_unknown_is_refused(tmp_path):
    path = aotc.export(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()),
                       (torch.randn(2, 8),), tmp_path / "v2.aotc", isa="x86-64-v2")
    native = read_raw_manifest(path)["target"]["native"]
    assert native["libraries"] == {"x86-64-v2": fmt.kernel_library("x86-64-v2")}
    assert aotc.load(path).library.level == "x86-64-v2"
    with pytest.raises(TargetError, match="no kernels built for x86-64-v3"):
        aotc.load(path, isa="x86-64-v3")
    with pytest.raises(UsageError, match="unknown CPU level"):
        aotc.load(path, isa="pentium")


def test_inspect_lists_the_levels(cli_mlp_artifact):
    proc = run_aotc("inspect", cli_mlp_artifact)
    assert proc.returncode == 0, proc.stderr
    for level in auto_levels():
        assert f"  {level} " in proc.stdout
        assert fmt.kernel_library(level) in proc.stdout
    assert f"{best_level()}" in proc.stdout and "this host loads it" in proc.stdout


def test_isa_pins_exactly_one_level():
    assert resolve_isa("x86-64-v3") == ("x86-64-v3",)
    assert resolve_isa("native") == (best_level(),)
    assert resolve_isa("auto") == auto_levels()
    with pytest.raises(UsageError, match="unknown CPU ISA level"):
        resolve_isa("x86-64-v9")


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is not None,
                    reason="the cross compiler is installed")
def test_a_cross_target_without_its_compiler_is_a_usage_error():
    with pytest.raises(UsageError) as e:
        aotc.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),), "/nonexistent/x.aotc",
                    isa="armv8-a")
    assert "aarch64-linux-gnu-g++" in e.value.what and "apt-get install" in e.value.fix


def test_a_library_of_no_level_is_refused(all_levels_artifact, tmp_path):
    from hostile import copy_artifact, edit_json
    art = copy_artifact(all_levels_artifact, tmp_path / "a.aotc")
    edit_json(art, fmt.MANIFEST,
              lambda m: m["target"]["native"]["libraries"].pop("x86-64-v2") and None)
    with pytest.raises(aotc.ArtifactError, match="a library of no level"):
        aotc.load(art)
