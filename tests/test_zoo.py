"""The zoo's fast subset: transformers architectures from benchmarks/zoo_models.py checked
in-process exactly as `python -m benchmarks.zoo` checks them (exported, loaded, compared with
eager on the example inputs and on fresh ones), a few seconds each, no torchvision needed."""
import pytest

from benchmarks import zoo_report
from benchmarks.zoo_check import check
from benchmarks.zoo_models import ZOO, zoo_spec

FAST = ("bert", "gpt2", "llama", "t5", "whisper", "vit")


@pytest.mark.parametrize("name", FAST)
def test_zoo_model_passes(name, tmp_path):
    rec = check(zoo_spec(f"transformers/{name}"), "small", tmp_path, compile_baseline=False)
    assert rec["status"] == "pass", rec
    assert rec["kernels"] > 0 and rec["externs"] > 0
    assert rec["export_s"] < zoo_report.EXPORT_BUDGET_S


def test_zoo_is_broad_and_names_are_unique():
    families = {s.family for s in ZOO}
    assert {"transformers", "torchvision", "timm"} <= families and len(ZOO) >= 60
    names = [f"{s.family}/{s.name}" for s in ZOO]
    assert len(names) == len(set(names))


def test_pass_rate_leaves_out_what_capture_cannot_take():
    recs = [{"model": "a", "status": "pass", "export_s": 3.0, "compile_s": 9.0},
            {"model": "b", "status": "run_failed"},
            {"model": "c", "status": "capture_failed"},
            {"model": "d", "status": "pass", "export_s": 12.0, "compile_s": 10.0}]
    s = zoo_report.summarize(recs)
    assert (s["passed"], s["capturable"], s["pass_rate"]) == (2, 3, 0.6667)
    assert s["over_export_budget"] == ["d"]   # slower than torch.compile in the same run
