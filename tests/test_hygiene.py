"""Export hygiene and argument checks: killed exports leave nothing running and nothing that
the next export does not remove; output paths and devices are checked before any slow work."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from aotc.artifact.staging import Staging, remove_stale
from conftest import SAMPLES, run_aotc, subprocess_env


def _killed_staging(parent, prefix) -> str:
    """A staging directory made by a process that was then SIGKILLed: its path."""
    code = textwrap.dedent(f"""
        import sys, time
        from aotc.artifact.staging import Staging
        s = Staging({prefix!r}, {str(parent)!r})
        (s.path / "big.o").write_bytes(b"x" * 1000)
        print(s.path, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=subprocess_env())
    path = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return path


def test_staging_of_a_killed_process_is_removed_by_the_next(tmp_path):
    dead = _killed_staging(tmp_path, ".m.aotc.tmp-")
    assert os.path.isdir(dead)
    live = Staging(".m.aotc.tmp-", tmp_path)      # a live one is never touched
    nxt = Staging(".m.aotc.tmp-", tmp_path)
    assert not os.path.exists(dead) and not os.path.exists(dead + ".lock")
    assert live.path.is_dir() and nxt.path.is_dir()
    assert remove_stale(tmp_path, ".m.aotc.tmp-") == []
    live.remove()
    nxt.remove()
    assert os.listdir(tmp_path) == []


def test_a_killed_export_leaves_no_compiler_running(tmp_path):
    """The C++ compiler's processes die with the export (parent-death signal)."""
    fake = tmp_path / "slow-cxx"
    pids = tmp_path / "pids"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo fake 1 && exit 0\n"
                    f"echo $$ >> {pids}\nexec sleep 120\n")
    fake.chmod(0o755)
    code = textwrap.dedent("""
        from aotc.codegen.cpp.build import build_libraries
        build_libraries(["int f() { return 1; }", "int g() { return 2; }"], ("x86-64",))
    """)
    env = dict(subprocess_env(), CXX=str(fake), XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.time() + 60
    while time.time() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
        time.sleep(0.1)
    children = [int(p) for p in pids.read_text().split()]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in children):
        time.sleep(0.1)
    assert not any(_alive(p) for p in children), "a compiler outlived its export"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_stale_artifact_staging_dir_is_removed_by_the_next_export(tmp_path):
    dead = _killed_staging(tmp_path, ".mlp.aotc.tmp-")
    proc = run_aotc("export", SAMPLES["mlp"].ref, "-i", "32x64", "-o", tmp_path / "mlp.aotc",
                    "--no-codegen")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["mlp.aotc"], dead


@pytest.mark.parametrize("out", ["", "   "])
def test_an_empty_output_path_is_a_usage_error(tmp_path, out):
    proc = run_aotc("export", SAMPLES["mlp"].ref, "-i", "32x64", "-o", out, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert os.listdir(tmp_path) == []


def test_an_output_under_a_file_fails_before_the_export(tmp_path):
    (tmp_path / "file").write_text("x")
    t = time.perf_counter()
    proc = run_aotc("export", SAMPLES["mlp"].ref, "-i", "32x64", "-o", tmp_path / "file" / "m")
    assert proc.returncode == 2, proc.stderr
    assert "capturing" not in proc.stderr and "not a directory" in proc.stderr
    assert time.perf_counter() - t < 30


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_output_directory_fails_before_the_export(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    proc = run_aotc("export", SAMPLES["mlp"].ref, "-i", "32x64", "-o", ro / "m.aotc")
    assert proc.returncode == 2 and "not writable" in proc.stderr


@pytest.mark.parametrize("device", ["nonsense:9", "tpu", "cuda:x"])
def test_a_malformed_device_is_a_usage_error(cli_mlp_artifact, device):
    proc = run_aotc("run", cli_mlp_artifact, "--device", device)
    assert proc.returncode == 2, proc.stderr
    assert "device" in proc.stderr
