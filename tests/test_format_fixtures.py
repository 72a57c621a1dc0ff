"""Stored artifacts of every format version must still load (or be refused clearly).

tests/fixtures/format_v<N>_*.aotc were written by the aotc of format version N: `tiny` ones are
extern-only (they load on any host), `kernels` ones hold C++ kernels built for the x86-64
baseline (format 4's are found by name, format 5's through the library's kernel table), `cuda`
ones Triton sources and cubins (run here through Triton's interpreter). When
FORMAT_VERSION changes, add a fixture of the new version and keep the old ones: each must load
and verify, or fail with an ArtifactError that says what to do.
"""
import platform
from pathlib import Path

import pytest

import aotc
from aotc.cli.report import verify_artifact
from aotc.artifact import format as fmt

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("format_v*.aotc"))


def test_every_format_version_has_a_fixture():
    versions = {int(p.name.split("_")[1][1:]) for p in FIXTURES}
    assert versions == set(fmt.CHANGELOG), "add a fixture for each format version"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_loads_and_verifies(path):
    version = int(path.name.split("_")[1][1:])
    if version not in fmt.CHANGELOG or version > fmt.FORMAT_VERSION:
        with pytest.raises(aotc.ArtifactError, match="format version"):
            aotc.load(path)
        return
    if "_tp" in path.name:   # tensor-parallel: parses and verifies; loading needs its ranks
        manifest = fmt.read_manifest(path)
        assert manifest.tensor_parallel.world_size == 2
        with pytest.raises(aotc.TargetError, match="no torch.distributed process group"):
            aotc.load(path)
        return
    if "_cuda" in path.name:   # Triton kernels: run here through the interpreter
        m = aotc.load(path, device="cpu", interpret=True)
        assert "verified" in verify_artifact(m)
        return
    if "kernels" in path.name and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("C++ kernels built for x86-64")
    m = aotc.load(path)
    assert "verified" in verify_artifact(m)
    assert ("kernels" in path.name) == (m.library is not None)
