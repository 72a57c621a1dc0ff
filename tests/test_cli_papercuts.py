"""CLI papercuts of issue 46 (item 5): each ends as a typed error with its exit code, says what
to do, and prints no library noise."""
from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

import pytest

from aotc.cli.report import summarize
from aotc.errors import UsageError
from aotc.artifact import format as fmt
from aotc.artifact import publish
from conftest import SAMPLES
from test_cli import invoke, workdir  # noqa: F401 - the CLI runner and an empty cwd fixture

MLP = SAMPLES["mlp"].ref


def test_data_dependent_branch_exits_3_without_graph_dumps(tmp_path, capfd):
    model = tmp_path / "branchy.py"
    model.write_text("import torch\n\n\nclass M(torch.nn.Module):\n"
                     "    def forward(self, x):\n"
                     "        if x.sum() > 0:\n"
                     "            return x * 2\n"
                     "        return x - 1\n")
    capfd.readouterr()
    result = invoke("export", f"{model}:M", "-i", "2x3", "-o", tmp_path / "m.aotc")
    leaked = capfd.readouterr()          # torch's loggers hold the process's own stderr
    assert result.exit_code == 3, result.output
    assert "branchy.py:6: if x.sum() > 0:" in result.output
    for text in (result.output, leaked.out + leaked.err):
        assert "GraphModule" not in text and "def forward" not in text, text
        assert "symbolic_shapes" not in text, text
    assert len(result.output.splitlines()) <= 10, result.output


def test_output_in_a_missing_folder_is_refused_and_nothing_created(workdir):
    out = workdir / "no" / "such" / "dir" / "x.aotc"
    result = invoke("export", MLP, "-i", "32x64", "-o", out)
    assert result.exit_code == 2, result.output
    assert f"the folder {out.parent} does not exist" in result.output
    assert "mkdir -p" in result.output
    assert list(workdir.iterdir()) == []


def test_output_that_is_a_file_is_a_usage_error_with_a_fix(workdir):
    (workdir / "afile").write_text("keep me")
    result = invoke("export", MLP, "-i", "32x64", "-o", "afile")
    assert result.exit_code == 2, result.output
    assert "existing file" in result.output and "fix: choose another name" in result.output
    assert (workdir / "afile").read_text() == "keep me"


def test_huge_example_input_is_a_usage_error(workdir):
    result = invoke("export", MLP, "-i", "100000x100000x100000", "-o", "x.aotc")
    assert result.exit_code == 2, result.output
    assert "more than this host's memory" in result.output
    assert "internal error" not in result.output


def test_unwritable_output_folder_is_a_usage_error(workdir, monkeypatch):
    """Refused before any work where the permission bits say so (tests/test_hygiene.py runs
    it for real where the tests do not run as root) ..."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == workdir
                        else real(p, mode))
    result = invoke("export", MLP, "-i", "32x64", "-o", "x.aotc")
    assert result.exit_code == 2, result.output
    assert "not writable" in result.output


def test_refused_staging_folder_is_a_usage_error(tmp_path, monkeypatch):
    """... and where the file system refuses anyway (root on a read-only mount)."""
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(UsageError, match="Permission denied") as info:
        publish.staging_beside(tmp_path / "x.aotc")
    assert info.value.exit_code == 2


def test_ctrl_c_exits_130_with_one_line(workdir, monkeypatch):
    import aotc.api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(aotc.api, "export_file", interrupted)
    result = invoke("export", MLP, "-i", "32x64", "-o", "x.aotc")
    assert result.exit_code == 130, result.output
    assert result.output.strip().splitlines()[-1].startswith("interrupted")
    assert "Traceback" not in result.output and "internal error" not in result.output


@pytest.mark.parametrize("flag", ["--rtol", "--atol"])
def test_negative_tolerance_is_a_usage_error(flag, tmp_path):
    result = invoke("verify", flag, "-1", tmp_path / "any.aotc")
    assert result.exit_code == 2, result.output
    assert flag in result.output


@pytest.mark.parametrize("times", [[1.0, 3.0], [3.0, 1.0], [1.0, 2.0, 10.0], [5.0],
                                   [0.5 + (i * 7919 % 13) for i in range(20)]])
def test_p90_is_never_below_the_median(times):
    s = summarize(times)
    assert s["min"] <= s["median"] <= s["p90"] <= max(times)


def test_run_twice_prints_p90_at_least_median(cli_mlp_artifact):
    result = invoke("run", "--runs", "2", "--warmup", "0", cli_mlp_artifact)
    assert result.exit_code == 0, result.output
    found = re.search(r"median ([\d.]+) ms, p90 ([\d.]+) ms", result.output)
    assert float(found[1]) <= float(found[2]), result.output


def test_artifact_root_mode_honours_the_umask(mlp_artifact, tmp_path):
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(mlp_artifact.stat().st_mode) == 0o777 & ~mask
    private = Path(tempfile.mkdtemp(dir=tmp_path))      # made 0700, as staging folders are
    old = os.umask(0o027)
    try:
        publish.publish_mode(private)
    finally:
        os.umask(old)
    assert stat.S_IMODE(private.stat().st_mode) == 0o750


def test_quiet_capture_lets_output_through_with_debug(capsys):
    """`aotc --debug` (the aotc logger at DEBUG) shows torch's output during capture."""
    import logging

    from aotc.exporter.capture import quiet
    log = logging.getLogger("aotc")
    with quiet():
        print("hidden")
    old = log.level
    log.setLevel(logging.DEBUG)
    try:
        with quiet():
            print("shown")
    finally:
        log.setLevel(old)
    out = capsys.readouterr().out
    assert "shown" in out and "hidden" not in out
