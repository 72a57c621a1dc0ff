"""The benchmark suite (benchmarks/): a smoke run of the harness end to end (eager + aotc on one
tiny model), every status on purpose-built failing systems, and the summary and accuracy rules.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import aotc

# benchmarks/ sits beside aotc's stage folders but is not part of the installed package: make it
# importable from the repository root, appended so nothing there shadows an installed module.
sys.path.append(str(Path(__file__).resolve().parents[1]))   # the source tree, for `benchmarks`

from benchmarks import accuracy, harness, models, report, run, systems  # noqa: E402

FAST = harness.Config(warmup=1, min_reps=3, max_reps=5, timing_s=0.0, build_limit_s=120)


# ------------------------------------------------------------------------------------ smoke
def test_smoke_run_writes_reports(tmp_path):
    """The CLI end to end on the smallest model: eager + aotc, latency point, few rounds."""
    rc = run.main(["--suite", "smoke", "--models", "mlp", "--systems", "eager,aotc",
                   "--points", "latency", "--warmup", "1", "--min-reps", "3", "--max-reps", "5",
                   "--timing-s", "0", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["meta"]["device"] == "cpu" and doc["meta"]["systems"] == ["eager", "aotc"]
    [row] = doc["results"]
    assert (row["model"], row["point"], row["batch"]) == ("mlp", "latency", 1)
    eager, compiled = row["systems"]["eager"], row["systems"]["aotc"]
    assert eager["status"] == "pass" and compiled["status"] == "pass", compiled.get("reason")
    for field in ("build_s", "load_s", "first_call_s", "cold_start_s", "artifact_bytes",
                  "median_s", "p90_s", "speedup"):
        assert compiled[field] > 0, field
    assert 3 <= compiled["reps"] <= 5
    assert compiled["speedup"] == pytest.approx(eager["median_s"] / compiled["median_s"])
    summary = doc["summary"]["all"]["aotc"]
    assert (summary["rows"], summary["passed"], summary["pass_rate"]) == (1, 1, 1.0)
    assert summary["geomean_speedup"] == pytest.approx(compiled["speedup"])
    md = (tmp_path / "results.md").read_text()
    assert "| aotc | 1/1 | 100% |" in md and "| mlp | latency | 1 |" in md
    assert (tmp_path / "results.png").stat().st_size > 10_000


def test_unknown_names_are_usage_errors(tmp_path, capsys):
    assert run.main(["--models", "nosuchmodel", "--out", str(tmp_path)]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert run.main(["--systems", "nosuchsystem", "--out", str(tmp_path)]) == 2


# ----------------------------------------------------------------------- failures, isolated
class _Tiny(nn.Module):
    def __init__(self, noisy: bool = False):
        super().__init__()
        self.fc, self.noisy = nn.Linear(8, 4), noisy

    def forward(self, x):
        y = self.fc(x)
        return {"y": y + torch.rand_like(y) if self.noisy else y, "ids": y.argmax(-1)}


def _spec(noisy: bool = False) -> models.ModelSpec:
    return models.ModelSpec(name="tiny", family="test", requires="torch",
                            build=lambda cfg: _Tiny(**cfg), configs={"small": {"noisy": noisy}},
                            inputs=models.features({"small": 8}), batches={"small": (1, 4)})


class _Broken(systems.System):
    """A system that fails in a chosen way."""

    def __init__(self, how: str):
        self.name, self.how = f"broken-{how}", how

    def build(self, model, inputs, workdir):
        if self.how == "export":
            raise RuntimeError("cannot export")
        if self.how == "slow":
            time.sleep(5)
        if self.how == "run":
            return systems.Built(call=lambda: 1 / 0)
        return systems.Built(call=lambda: {"y": model(*inputs)["y"] + 1.0,
                                           "ids": model(*inputs)["ids"]})


def test_each_failure_is_recorded_and_the_run_goes_on():
    chosen = [systems.SYSTEMS["eager"], _Broken("export"), _Broken("run"), _Broken("accuracy"),
              _Broken("slow"), systems.SYSTEMS["eager"].__class__()]
    chosen[-1].name = "eager-again"
    cfg = harness.Config(warmup=1, min_reps=3, max_reps=3, timing_s=0, build_limit_s=0.5)
    rec = harness.run_point(_spec(), "small", "throughput", chosen, cfg)
    got = {name: r["status"] for name, r in rec["systems"].items()}
    assert got == {"eager": "pass", "broken-export": "fail_export", "broken-run": "fail_run",
                   "broken-accuracy": "fail_accuracy", "broken-slow": "fail_export",
                   "eager-again": "pass"}
    assert "cannot export" in rec["systems"]["broken-export"]["reason"]
    assert "ZeroDivisionError" in rec["systems"]["broken-run"]["reason"]
    assert "timed out" in rec["systems"]["broken-slow"]["reason"]
    assert "rmse" in rec["systems"]["broken-accuracy"]["reason"]
    assert rec["systems"]["broken-accuracy"]["speedup"] > 0       # still timed
    assert "speedup" not in rec["systems"]["broken-export"]
    assert rec["batch"] == 4 and rec["inputs"] == ["float32[4, 8]"]


def test_nondeterministic_eager_is_flagged():
    rec = harness.run_point(_spec(noisy=True), "small", "latency",
                            [systems.SYSTEMS["eager"], _Broken("accuracy")], FAST)
    assert {r["status"] for r in rec["systems"].values()} == {"eager_nondeterministic"}


def test_unavailable_systems_and_models_are_skipped():
    chosen, skipped = systems.select(None, torch.device("cpu"))
    assert chosen[0].name == "eager" and "torch.compile:reduce-overhead" in skipped
    missing = models.ModelSpec(name="x", family="test", requires="no_such_module_xyz",
                               build=None, configs={}, inputs=None)
    assert "not installed" in missing.available()


# ------------------------------------------------------------------------- summary rules
def test_geomean():
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert report.geomean([]) is None and report.geomean([None]) is None


def _row(status, speedup=None, **kw):
    return {"status": status, "speedup": speedup, **kw}


def test_summary_counts_failures_as_1x_and_ignores_skipped():
    rows = [_row("pass", 4.0, build_s=1.0), _row("pass", 1.0, build_s=3.0),
            _row("fail_accuracy", 9.0), _row("fail_export"), _row("skipped")]
    s = report.summarize_system(rows)
    assert (s["rows"], s["passed"], s["pass_rate"]) == (4, 2, 0.5)
    assert s["geomean_speedup"] == pytest.approx(2.0)                    # passing only
    assert s["geomean_speedup_failures_as_1x"] == pytest.approx(math.sqrt(2.0))   # 4*1*1*1
    assert s["median_build_s"] == pytest.approx(2.0)
    assert s["statuses"] == {"pass": 2, "fail_accuracy": 1, "fail_export": 1}


def test_summarize_by_point_excludes_eager():
    rec = lambda point, speed: {"point": point, "systems": {   # noqa: E731
        "eager": _row("pass"), "aotc": _row("pass", speed)}}
    s = report.summarize([rec("latency", 2.0), rec("throughput", 8.0)])
    assert set(s["all"]) == {"aotc"}
    assert s["all"]["aotc"]["geomean_speedup"] == pytest.approx(4.0)
    assert s["latency"]["aotc"]["geomean_speedup"] == pytest.approx(2.0)


def test_merge_keeps_one_record_per_point_the_latest_measured():
    m = lambda model, point, tag, skipped=None: {   # noqa: E731
        "model": model, "point": point, "tag": tag, **({"skipped": skipped} if skipped else {})}
    parts = [[m("a", "latency", 1), m("a", "throughput", 1), m("b", "latency", 1, "budget")],
             [m("a", "latency", 2), m("a", "throughput", 2, "budget"), m("b", "latency", 2)]]
    out = report.latest(parts)
    assert [(r["model"], r["point"], r["tag"]) for r in out] == [
        ("a", "latency", 2), ("a", "throughput", 1), ("b", "latency", 2)]


def test_parts_deal_models_round_robin():
    size, specs = models.select("small")
    assert size == "small" and len(specs) == len(models.REGISTRY) - len(models.GPU_SET_ONLY)
    parts = [models.split(specs, k, 3) for k in (1, 2, 3)]
    assert sorted((s.name for p in parts for s in p)) == sorted(s.name for s in specs)
    with pytest.raises(ValueError):
        models.split(specs, 4, 3)


# ------------------------------------------------------------------------- accuracy rule
def _ref_and_eager(shape=(64,), dtype=torch.float32, noise=1e-6):
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(*shape, generator=g, dtype=torch.float64)
    eager = (ref + noise * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)
    return ref, eager


def test_close_to_eager_passes():
    ref, eager = _ref_and_eager()
    assert accuracy.judge([eager + 1e-6], [eager], [ref]).ok


def test_error_relative_to_eagers_error():
    ref, eager = _ref_and_eager(noise=1e-3)          # eager itself is 1e-3 off the reference
    eager_err = accuracy.rmse(eager, ref)
    inside = (ref + 1.5 * (eager.double() - ref)).float()    # 1.5x eager's error: < 2x
    outside = (ref + 3.0 * (eager.double() - ref)).float()   # 3x eager's error: > 2x + floor
    v = accuracy.judge([inside], [eager], [ref])
    assert v.ok and v.eager_error == pytest.approx(eager_err, rel=1e-3)
    v = accuracy.judge([outside], [eager], [ref])
    assert not v.ok and "rmse" in v.reason


def test_absolute_floor_and_bf16_multiplier():
    ref, eager = _ref_and_eager(noise=0.0)           # eager exact: only the floor allows error
    assert accuracy.judge([eager + 5e-6 * torch.sign(eager)], [eager], [ref]).ok
    assert not accuracy.judge([eager + 1e-3], [eager], [ref]).ok
    ref, eager = _ref_and_eager(dtype=torch.bfloat16, noise=0.0)   # bf16 rounding error
    worse = (ref + 2.5 * (eager.double() - ref)).bfloat16()
    assert accuracy.judge([worse], [eager], [ref]).ok             # within 3x for bf16


def test_structure_dtype_nan_and_integers():
    ref, eager = _ref_and_eager()
    assert not accuracy.judge([eager, eager], [eager], [ref]).ok            # count
    assert not accuracy.judge([eager[:10]], [eager], [ref]).ok               # shape
    assert not accuracy.judge([eager.double()], [eager], [ref]).ok           # dtype
    nan = eager.clone()
    nan[3] = float("nan")
    assert not accuracy.judge([nan], [eager], [ref]).ok
    ids = torch.arange(5)
    assert accuracy.judge({"ids": ids}, {"ids": ids.clone()}, {"ids": ids}).ok
    assert not accuracy.judge({"ids": ids + 1}, {"ids": ids}, {"ids": ids}).ok
    assert accuracy.judge([eager], [eager], None).ok                         # no reference


def test_flatten_orders_like_model_outputs():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    got = accuracy.flatten({"x": a, "y": (b, [c]), "none": None})
    assert [t.item() for t in got] == [0.0, 1.0, 2.0]
    assert accuracy.identical({"x": a}, {"x": a.clone()})
    assert not accuracy.identical({"x": a}, {"x": b})


def test_time_limit_interrupts():
    with pytest.raises(TimeoutError), harness.time_limit(0.2) as limit:
        time.sleep(2)
    assert limit.expired


# ------------------------------------------------------------------------------ aotc bench
def test_aotc_bench_prints_timings(tmp_path):
    from click.testing import CliRunner

    from aotc.cli.main import main
    path = aotc.export(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (torch.randn(2, 8),),
                       tmp_path / "tiny.aotc")
    result = CliRunner().invoke(main, ["bench", str(path), "--runs", "5", "--warmup", "1"])
    assert result.exit_code == 0, result.output
    for word in ("load", "first call", "median", "p90", "over 5 runs after 1 warm-up runs"):
        assert word in result.output
    missing = CliRunner().invoke(main, ["bench", str(tmp_path / "none.aotc")])
    assert missing.exit_code == aotc.ArtifactError.exit_code


# --------------------------------------------------------------------- dynamic shapes
def test_dynamic_smoke_run_records_ratio_and_guard_cost(tmp_path):
    """benchmarks/dynamic.py end to end on the mlp sample at batch 1: one dynamic artifact
    (batch 1..64, exported at batch 64) against a static one, few rounds. No timing
    assertions beyond the fields being there and consistent."""
    from benchmarks import dynamic
    rc = dynamic.main(["--models", "mlp", "--points", "latency", "--warmup", "1",
                       "--min-reps", "3", "--max-reps", "5", "--timing-s", "0",
                       "--guard-calls", "40", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["meta"]["benchmark"] == "dynamic shapes" and doc["meta"]["commit"]
    [row] = doc["results"]
    assert (row["model"], row["point"], row["batch"], row["status"]) == ("mlp", "latency", 1,
                                                                        "pass")
    assert row["dynamic_artifact"]["symbols"]["batch"] == {"min": 1, "max": 64, "example": 64}
    static, dyn = row["systems"]["static"], row["systems"]["dynamic"]
    for res in (static, dyn):
        assert res["status"] == "pass", res.get("reason")
        assert res["median_s"] > 0 and res["guard_s"] > 0 and 0 < res["guard_share"]
        assert res["graph_status"] == {"forward": "off"}          # CPU: no CUDA graphs
    assert static["build_s"] > 0 and dyn["build_s"] is None       # exported once per model
    assert row["dynamic_vs_static"] == pytest.approx(dyn["median_s"] / static["median_s"])
    s = doc["summary"]
    assert (s["points"], s["passed"]) == (1, 1)
    assert s["worst_dynamic_vs_static"] == pytest.approx(row["dynamic_vs_static"])
    assert s["dynamic"]["median_guard_us"] == pytest.approx(dyn["guard_s"] * 1e6)
    md = (tmp_path / "results.md").read_text()
    assert "| mlp | latency | 1 | - |" in md and "dynamic/static: geomean" in md
    assert dynamic.main(["--models", "mlp", "--points", "nosuchpoint",
                         "--out", str(tmp_path)]) == 2


def test_every_import_of_the_benchmarks_and_scripts_resolves():
    """Benchmarks and GPU scripts import from each other inside functions that only a long run
    reaches: every `from benchmarks.X import Y` / `from aotc.X import Y` in them must name a
    module and a name that exist (a name moved by a refactor broke three benchmarks once)."""
    import ast
    import importlib
    root = Path(__file__).resolve().parents[1]
    missing = []
    for path in sorted([*(root / "benchmarks").glob("*.py"), *(root / "scripts").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module \
                    or node.module.split(".")[0] not in ("benchmarks", "aotc"):
                continue
            module = importlib.import_module(node.module)
            missing += [f"{path.name}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                        if not hasattr(module, a.name)
                        and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert not missing, missing
