"""A fixed campaign of hostile mutations (scripts/fuzz_artifact.py): one JSON value of the
manifest, a plan or a runner file changed and the hashes recomputed, then the copy loaded and
run with either runner. Every case must run or raise an AotcError: no untyped error, no crash.
(The campaign that found the out-of-bounds read of tests/test_hostile_plans.py, and the
untyped failures of decode positions and extern calls, ran the same script longer.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("fixture,seed", [("format_v13_kernels.aotc", 11),
                                          ("format_v12_generator.aotc", 12),
                                          ("format_v17_kernels.aotc", 34)])
def test_mutated_artifacts_fail_only_with_typed_errors(fixture, seed):
    done = subprocess.run([sys.executable, str(ROOT / "scripts/fuzz_artifact.py"),
                           str(FIXTURES / fixture), "--cases", "40", "--seed", str(seed)],
                          capture_output=True, text=True, timeout=600)
    findings = [ln for ln in done.stdout.splitlines() if ln.startswith(("FINDING", "CRASH"))]
    assert done.returncode == 0 and not findings, findings or done.stderr[-2000:]
    assert "40 cases, 0 findings" in done.stdout


def test_mutated_training_artifacts_fail_only_with_typed_errors(tmp_path):
    # forward, then backward from the outputs' sum (a damaged backward plan raised untyped
    # errors until its failures were reported as an inference plan's are)
    from aotc.api import export_file
    from aotc.exporter.specs import parse_input_specs
    art = export_file(f"{ROOT}/samples/mlp.py:Net", parse_input_specs(["32x64"]),
                      tmp_path / "t.aotc", train=True)
    done = subprocess.run([sys.executable, str(ROOT / "scripts/fuzz_artifact.py"), str(art),
                           "--cases", "40", "--seed", "41"],
                          capture_output=True, text=True, timeout=600)
    findings = [ln for ln in done.stdout.splitlines() if ln.startswith(("FINDING", "CRASH"))]
    assert done.returncode == 0 and not findings, findings or done.stderr[-2000:]
    assert "40 cases, 0 findings" in done.stdout
