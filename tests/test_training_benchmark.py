"""The training-step benchmark (benchmarks/training.py): a smoke run end to end (eager + aotc on
the mlp sample, few rounds), and a system with wrong gradients is never timed as a pass. No
timing assertions."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.append(str(Path(__file__).resolve().parents[1]))   # the source tree, for `benchmarks`

from benchmarks import harness, models, training, training_step  # noqa: E402

FAST = harness.Config(warmup=1, min_reps=2, max_reps=3, timing_s=0.0, build_limit_s=120)


def test_smoke_run_writes_json_and_markdown(tmp_path):
    rc = training.main(["--models", "mlp", "--systems", "eager,aotc", "--point", "latency",
                        "--warmup", "1", "--min-reps", "2", "--max-reps", "3", "--timing-s", "0",
                        "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["meta"]["benchmark"] == "training step"
    assert doc["meta"]["systems"] == ["eager", "aotc"]
    [row] = doc["results"]
    assert (row["model"], row["batch"]) == ("mlp", 1)
    eager, compiled = row["systems"]["eager"], row["systems"]["aotc"]
    assert eager["status"] == "pass" and compiled["status"] == "pass", compiled.get("reason")
    for field in ("build_s", "load_s", "first_step_s", "artifact_bytes", "median_s", "p90_s",
                  "min_s", "speedup", "saved_bytes", "saved_tensors", "manifest_saved_bytes",
                  "manifest_saved_tensors", "saved_vs_eager"):
        assert compiled[field] > 0, field
    assert compiled["grad_error"] is not None and compiled["eager_grad_error"] is not None
    assert 2 <= compiled["reps"] <= 3
    assert compiled["speedup"] == pytest.approx(eager["median_s"] / compiled["median_s"])
    assert eager["saved_bytes"] > 0
    assert compiled["saved_vs_eager"] == pytest.approx(compiled["saved_bytes"]
                                                       / eager["saved_bytes"])
    summary = doc["summary"]["aotc"]
    assert (summary["rows"], summary["passed"]) == (1, 1)
    assert summary["geomean_speedup"] == pytest.approx(compiled["speedup"])
    md = (tmp_path / "results.md").read_text()
    assert "| aotc | 1/1 |" in md and "| mlp | 1 |" in md


def test_unknown_names_are_usage_errors(tmp_path, capsys):
    assert training.main(["--models", "nosuchmodel", "--out", str(tmp_path)]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert training.main(["--systems", "nosuchsystem", "--out", str(tmp_path)]) == 2


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return {"y": torch.tanh(self.fc(x))}


class _WrongGradients(training_step.EagerTrain):
    """Eager with the outputs scaled a little: forward and backward run, gradients are off."""
    name = "wrong"

    def build(self, model, inputs, workdir):
        import copy
        model = copy.deepcopy(model)
        return training_step.Trainee(module=model,
                                forward=lambda: {"y": model(*inputs)["y"] * 1.01})


def test_wrong_gradients_fail_accuracy_and_stay_out_of_the_summary():
    spec = models.ModelSpec(name="tiny", family="test", requires="torch",
                            build=lambda cfg: _Tiny(), configs={"small": {}},
                            inputs=models.features({"small": 8}), batches={"small": (1, 4)})
    rec = training.run_model(spec, "small", "throughput",
                             [training.TRAIN_SYSTEMS["eager"], _WrongGradients()], FAST)
    wrong = rec["systems"]["wrong"]
    assert rec["systems"]["eager"]["status"] == "pass"
    assert wrong["status"] == "fail_accuracy" and "fc." in wrong["reason"]
    assert wrong.get("median_s")      # still timed, but
    assert training.summarize([rec])["wrong"]["geomean_speedup"] is None   # never counted
