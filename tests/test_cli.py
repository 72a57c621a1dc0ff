"""The `aotc` command line: argument errors, typed exit codes, tracebacks, happy paths."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import aotc
from aotc.cli.main import main
from aotc.errors import (ArtifactError, ExportError, GuardError, LoweringError, TargetError,
                         UsageError, VerifyError)
from aotc.options import ExportOptions, option_fields
from aotc.artifact import format as fmt
from conftest import (MODELS_DIR, SAMPLES, flip_byte, read_raw_manifest, replace_file, run_aotc,
                      snapshot)

MLP = SAMPLES["mlp"].ref


def invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], **kwargs)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty current directory; tests assert it stays empty when nothing may be written."""
    d = tmp_path / "cwd"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


@pytest.fixture
def tampered(artifact_copy) -> Path:
    flip_byte(artifact_copy / fmt.WEIGHTS, (artifact_copy / fmt.WEIGHTS).stat().st_size // 2)
    return artifact_copy


def test_exit_codes_are_distinct():
    codes = [c.exit_code for c in (UsageError, ExportError, LoweringError, ArtifactError,
                                   GuardError, TargetError, VerifyError)]
    assert codes == [2, 3, 4, 5, 6, 7, 8]


def test_every_export_option_is_a_flag():
    params = {p.name for p in main.commands["export"].params}
    assert {name for name, *_ in option_fields()} <= params
    # the manifest records every option but debugging aids that leave the artifact as it is
    assert set(ExportOptions().to_json()) == {name for name, *_ in option_fields()} - {
        "dump_passes"}


# ------------------------------------------------------------------------ malformed arguments

BAD_EXPORT_ARGS = {
    "double x": [MLP, "-i", "32xx64"],
    "letters": [MLP, "-i", "a x b"],
    "zero dim": [MLP, "-i", "0x4"],
    "trailing x": [MLP, "-i", "32x"],
    "too many colons": [MLP, "-i", "32x64:float32:0..9:1"],
    "unknown dtype": [MLP, "-i", "32x64:float33"],
    "empty dtype": [MLP, "-i", "32x64:"],
    "range on float": [MLP, "-i", "32x64:float32:0..9"],
    "reversed range": [MLP, "-i", "32x64:int64:9..0"],
    "missing file": ["does_not_exist.py:Net", "-i", "32x64"],
    "not a py file": ["__NOTPY__:Net", "-i", "32x64"],
    "no class name": [SAMPLES["mlp"].ref.rpartition(":")[0], "-i", "32x64"],
    "bad init json": [MLP, "-i", "32x64", "--init-args", "{dim: 64"],
    "init json scalar": [MLP, "-i", "32x64", "--init-args", "64"],
    "bad target": [MLP, "-i", "32x64", "--target", "tpu"],
    "cpu with arch": [MLP, "-i", "32x64", "--target", "cpu:sm_90"],
    "bad arch": [MLP, "-i", "32x64", "--target", "cuda:sm9"],
    "unsupported arch": [MLP, "-i", "32x64", "--target", "cuda:sm_12"],
    "no example input": [MLP],
    "unknown option": [MLP, "-i", "32x64", "--frobnicate"],
    "dump passes into a file": [MLP, "-i", "32x64", "--dump-passes", "/dev/null"],
}
EXPECTED_WORDS = {
    "double x": "32xx64", "letters": "a x b", "zero dim": "zero", "unknown dtype": "float33",
    "missing file": "does_not_exist.py", "bad init json": "--init-args",
    "init json scalar": "--init-args", "bad target": "tpu", "cpu with arch": "cpu:sm_90",
    "bad arch": "sm9", "unsupported arch": "sm_12", "range on float": "integer",
    "reversed range": "9..0", "dump passes into a file": "--dump-passes",
}


@pytest.mark.parametrize("case", sorted(BAD_EXPORT_ARGS))
def test_malformed_export_arguments_exit_2_and_write_nothing(case, workdir):
    args = list(BAD_EXPORT_ARGS[case])
    if args[0] == "__NOTPY__:Net":
        (workdir.parent / "model.txt").write_text("x = 1\n")
        args[0] = f"{workdir.parent / 'model.txt'}:Net"
    result = invoke("export", *args, "-o", workdir / "out.aotc")
    assert result.exit_code == 2, result.output
    assert list(workdir.iterdir()) == []
    assert "Traceback" not in result.output
    if case in EXPECTED_WORDS:
        assert EXPECTED_WORDS[case] in result.output


def test_malformed_arguments_with_default_output_write_nothing(workdir):
    result = invoke("export", MLP, "-i", "32xx64")
    assert result.exit_code == 2
    assert list(workdir.iterdir()) == []


def test_missing_class_lists_available_names(workdir):
    result = invoke("export", f"{MODELS_DIR / 'several.py'}:Gamma", "-i", "2x4", "-o",
                    workdir / "out.aotc")
    assert result.exit_code == 2, result.output
    assert "Gamma" in result.output
    assert "available: Alpha, Beta, make_gamma" in result.output
    assert "WIDTH" not in result.output.split("available:")[1].splitlines()[0]
    assert list(workdir.iterdir()) == []
    assert "Traceback" not in result.output


def test_missing_class_in_sample(workdir):
    result = invoke("export", f"{SAMPLES['mlp'].ref.rpartition(':')[0]}:Nope", "-i", "32x64")
    assert result.exit_code == 2
    assert "available: Net" in result.output
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize("spec", ["32x64:int8:0..1000", "32x64:uint8:-5..5"])
def test_value_range_outside_dtype_exits_2(spec, workdir):
    result = invoke("export", MLP, "-i", spec, "-o", workdir / "out.aotc")
    assert list(workdir.iterdir()) == []
    assert result.exit_code == 2, result.output


# ----------------------------------------------------------------------- typed failures, codes

def test_forward_raising_exits_3_without_traceback(workdir):
    # A user's file lives outside the aotc tree (see test_export_errors for the in-tree case).
    model = shutil.copy(MODELS_DIR / "eager_failure.py", workdir.parent / "eager_failure.py")
    result = invoke("export", f"{model}:Net", "-i", "2x4", "-o", workdir / "out.aotc")
    assert result.exit_code == 3, result.output
    assert "error (ExportError)" in result.output
    assert "eager_failure.py:" in result.output and "h.view(3, 5)" in result.output
    assert "Traceback" not in result.output
    assert list(workdir.iterdir()) == []


def test_constructor_raising_exits_3(workdir):
    result = invoke("export", MLP, "-i", "32x64", "--init-args", '{"nope": 1}', "-o",
                    workdir / "out.aotc")
    assert result.exit_code == 3, result.output
    assert "constructing" in result.output and "nope" in result.output
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--json"], ["run", "--runs", "1"],
                                     ["verify"]])
def test_tampered_artifact_exits_5(command, tampered):
    result = invoke(*command, tampered)
    assert result.exit_code == 5, result.output
    assert "error (ArtifactError)" in result.output
    assert "weights.safetensors" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["inspect", "run", "verify"])
def test_missing_artifact_exits_5(command, tmp_path):
    result = invoke(command, tmp_path / "nothing.aotc")
    assert result.exit_code == 5, result.output


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a host without CUDA")
def test_no_gpu_is_a_target_error_exit_7(cli_mlp_artifact):
    with pytest.raises(TargetError):
        aotc.load(cli_mlp_artifact, device="cuda")
    result = invoke("run", cli_mlp_artifact, "--device", "cuda", "--runs", "1")
    assert result.exit_code == 7, result.output
    assert "error (TargetError)" in result.output


def test_debug_reraises_in_process(tampered):
    result = invoke("--debug", "verify", tampered)
    assert isinstance(result.exception, ArtifactError)


def test_subprocess_tampered_no_traceback_then_debug_traceback(tampered):
    plain = run_aotc("verify", tampered)
    assert plain.returncode == 5, plain.stderr
    assert "error (ArtifactError)" in plain.stderr
    assert "Traceback" not in plain.stderr + plain.stdout
    debug = run_aotc("--debug", "verify", tampered)
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr
    assert "ArtifactError" in debug.stderr


def test_subprocess_inspect_tampered_exits_5(tampered):
    proc = run_aotc("inspect", tampered)
    assert proc.returncode == 5, proc.stderr
    assert "Traceback" not in proc.stderr


def test_verify_detects_wrong_recorded_outputs_exit_8(artifact_copy):
    """A validly signed artifact whose recorded outputs are wrong: verify fails with code 8."""
    from safetensors.torch import load, save
    rel = fmt.SAMPLE_OUTPUTS
    outs = load((artifact_copy / rel).read_bytes())
    outs = {k: v + 1.0 for k, v in outs.items()}
    replace_file(artifact_copy, rel, save(outs))
    aotc.load(artifact_copy)       # still a valid artifact
    result = invoke("verify", artifact_copy)
    assert result.exit_code == 8, result.output
    assert "error (VerifyError)" in result.output and "output #0" in result.output


def test_verify_without_samples_exit_8(tmp_path):
    out = tmp_path / "nosamples.aotc"
    result = invoke("export", MLP, "-i", "32x64", "--no-record-samples", "-o", out)
    assert result.exit_code == 0, result.output
    assert fmt.SAMPLE_INPUTS not in snapshot(out)
    result = invoke("verify", out)
    assert result.exit_code == 8, result.output
    assert "no recorded samples" in result.output


# ------------------------------------------------------------------------------- happy paths

def test_export_prints_path_and_progress(tmp_path):
    out = tmp_path / "named.aotc"
    result = invoke("export", MLP, "-i", "32x64", "-o", out, "--name", "tiny-mlp")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out.absolute())
    assert "capturing" in result.stderr and "wrote" in result.stderr
    manifest = read_raw_manifest(out)
    assert manifest["model"]["name"] == "tiny-mlp"
    # Every option (the defaults included) is recorded, as the API would record it.
    assert manifest["options"] == ExportOptions(name="tiny-mlp").to_json()
    assert manifest["options"]["name"] == "tiny-mlp"


def test_inspect_text(cli_mlp_artifact):
    result = invoke("inspect", cli_mlp_artifact)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"format {fmt.FORMAT_VERSION}" in out                       # versions
    assert re.search(r"aotc \d+\.\d+\.\d+, torch \d+\.\d+", out)
    assert "forward(x: float32[32, 64])" in out                         # inputs
    assert "-> float32[32, 10]" in out                                  # outputs
    assert "guards (checked on every call):" in out                     # guards
    assert "#0 x: dtype float32, rank 2, dim 0 == 32, dim 1 == 64" in out
    assert re.search(r"^ops:\s+\d+ ATen", out, re.M)                   # ops
    assert "addmm" in out and "gelu" in out
    assert re.search(r"weights: 8 tensors", out)                        # weights
    for rel in set(snapshot(cli_mlp_artifact)) - {fmt.MANIFEST}:                 # files
        assert rel in out
    assert "model:   Net" in out and "target:  cpu" in out


def test_inspect_hf_shows_value_range_apart_from_guards(exported):
    """An integer input's recorded range is what random inputs draw from, not a guard."""
    result = invoke("inspect", exported("bert").path)
    assert result.exit_code == 0, result.output
    guards = result.output.split("guards (checked on every call):")[1].split("steps:")[0]
    guarded, sampling = guards.split("sampling range for random inputs")
    assert "#0 input_ids: dtype int64, rank 2, dim 0 == 2, dim 1 == 32\n" in guarded
    assert "values in" not in guarded
    assert "#0 input_ids: values in [" in sampling
    assert "last_hidden_state" in result.output and "pooler_output" in result.output


def test_inspect_json_is_the_manifest(cli_mlp_artifact):
    result = invoke("inspect", "--json", cli_mlp_artifact)
    assert result.exit_code == 0
    assert result.output.encode() == (cli_mlp_artifact / fmt.MANIFEST).read_bytes()
    assert json.loads(result.output)["format_version"] == fmt.FORMAT_VERSION


def test_inspect_code(cli_mlp_artifact):
    result = invoke("inspect", "--code", cli_mlp_artifact)
    assert result.exit_code == 0
    assert "def plan_forward(inputs, symbols):" in result.output


def test_run_prints_outputs_and_latency(exported):
    result = invoke("run", exported("transformer").path, "--runs", "3", "--warmup", "1")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "forward(x: float32[2, 64, 128])" in out
    assert "output['hidden']: float32[2, 64, 128]" in out
    assert "output['pooled']: float32[2, 128]" in out
    assert re.search(r"load [\d.]+ ms, first call [\d.]+ ms, median [\d.]+ ms, p90 [\d.]+ ms "
                     r"over 3 runs", out), out


def test_run_bad_option_exit_2(cli_mlp_artifact):
    assert invoke("run", cli_mlp_artifact, "--runs", "0").exit_code == 2


def test_verify_happy_path(exported):
    result = invoke("verify", exported("bert").path)
    assert result.exit_code == 0, result.output
    assert "output #0: ok" in result.output and "output #1: ok" in result.output
    assert "verified 2 outputs" in result.output


def test_subprocess_inspect_run_verify(cli_mlp_artifact):
    for cmd in (["inspect"], ["run", "--runs", "2"], ["verify"]):
        proc = run_aotc(*cmd, cli_mlp_artifact)
        assert proc.returncode == 0, (cmd, proc.stderr)
    assert "verified 1 outputs" in proc.stdout


def test_version_and_help():
    assert aotc.__version__ in invoke("--version").output
    result = invoke("export", "--help")
    assert result.exit_code == 0
    for flag in ("--target", "--no-strict", "--no-record-samples", "--init-args", "-i"):
        assert flag in result.output
