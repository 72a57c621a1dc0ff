"""Stored artifacts of every format version must still load (or be refused clearly).

tests/fixtures/format_v<N>_*.aotc were written by the aotc of format version N (extern-only, so
they load on any host). When FORMAT_VERSION changes, add a fixture of the new version and keep
the old ones: each must load and verify, or fail with an ArtifactError that says what to do.
"""
from pathlib import Path

import pytest

import aotc
from aotc.cli.report import verify_artifact
from aotc.runtime import format as fmt

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
    m = aotc.load(path)
    assert "verified" in verify_artifact(m)
