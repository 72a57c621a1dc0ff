"""Issue 49's GPU set (benchmarks/gpu_set.py, benchmarks/prebuild.py): the summary's ratios,
flags and decode rows from stored results, and an artifact exported ahead by prebuild.py
found and loaded by the harness's aotc system."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))   # the source tree, for `benchmarks`

from benchmarks import gpu_set, harness, models, prebuild, systems  # noqa: E402


def _write(folder: Path, doc: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(doc))


def _point(model, point, batch, aotc_s, base_s, base="torch.compile:reduce-overhead",
           status="pass"):
    return {"model": model, "point": point, "batch": batch,
            "systems": {"eager": {"status": "pass", "median_s": 1.0},
                        base: {"status": "pass", "median_s": base_s},
                        "aotc": {"status": status, "median_s": aotc_s}}}


def _decode(model, batch, aotc, ro, roofline):
    return {"model": model, "batch": batch, "roofline_fraction": {"aotc": roofline},
            "decode_tokens_per_s": {"aotc": aotc, "reduce-overhead": ro, "eager": 1.0}}


def test_summary_ratios_flags_and_decode_rows(tmp_path):
    meta = {"commit": "abc", "command": "cmd", "device": "cuda"}
    _write(tmp_path / "inference", {"meta": meta, "results": [
        _point("gpt2_lm", "throughput", 16, aotc_s=2.0, base_s=1.0),   # 0.5x: flagged
        _point("convnext", "latency", 1, aotc_s=1.0, base_s=2.0),
        _point("bert", "latency", 1, aotc_s=1.0, base_s=2.0, status="fail_accuracy"),
        {"model": "t5", "point": "latency", "batch": 1, "skipped": "budget", "systems": {}}]})
    _write(tmp_path / "training", {"meta": meta, "results": [
        _point("gpt2", "throughput", 16, aotc_s=1.0, base_s=1.5)]})
    _write(tmp_path / "decode-llama3-1b", {"meta": meta, "rows": [
        _decode("llama3-1b", 1, aotc=100.0, ro=80.0, roofline=0.7),
        _decode("llama3-1b", 8, aotc=640.0, ro=800.0, roofline=0.5)]})
    (tmp_path / "decode-llama3-1b.log").write_text("a log, not a part\n")
    assert gpu_set.main([str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    rows = {r["point"]: r for r in doc["rows"]}
    assert rows["gpt2_lm / throughput (b16)"]["ratio"] == 0.5
    assert rows["gpt2_lm / throughput (b16)"]["flag"]
    assert rows["bert / latency (b1)"]["ratio"] is None and rows["bert / latency (b1)"]["flag"]
    assert not rows["convnext / latency (b1)"]["flag"]
    b8 = rows["llama3-1b decode (b8)"]
    assert b8["ratio"] == 0.8 and b8["per_sequence_vs_b1"] == pytest.approx(0.8) and b8["flag"]
    ratios = [0.5, 2.0, 1.5, 1.25, 0.8]
    assert doc["summary"]["geomean"] == pytest.approx(
        math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert doc["summary"]["flagged"] == 3 and doc["summary"]["points"] == 6
    assert "**below**" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 0


def test_gpu_set_has_20_inference_points():
    size, specs = models.select("gpu-set")
    assert size == "full" and len(specs) * len(models.POINTS) == 20
    assert {"gpt2_lm", "convnext", "vit_s16_b32"} <= {s.name for s in specs}
    assert "gpt2_lm" not in models.SUITES["full"][1]    # the earlier suites keep their members


def test_a_prebuilt_artifact_is_found_and_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")      # what export_point sets in its worker
    line = prebuild.export_point("mlp", "small", "latency", "fp32", "cpu", tmp_path)
    assert "mlp / latency" in line and len(list(tmp_path.glob("*.aotc"))) == 1
    spec = next(s for s in models.REGISTRY if s.name == "mlp")
    cfg = harness.Config(warmup=1, min_reps=2, max_reps=3, timing_s=0.0, build_limit_s=60)
    rec = harness.run_point(spec, "small", "latency",
                            [systems.SYSTEMS["eager"], systems.Aotc(prebuilt=tmp_path)], cfg)
    assert rec["systems"]["aotc"]["status"] == "pass", rec["systems"]["aotc"]
    assert rec["systems"]["aotc"]["build_s"] == json.loads(
        next(tmp_path.glob("*.json")).read_text())["export_s"]


def test_a_failed_prebuild_is_that_points_export_failure(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps({"error": "LoweringError: no"}))
    with pytest.raises(RuntimeError, match="prebuilt export failed: LoweringError"):
        systems.wait_for_artifact(tmp_path, "k")
