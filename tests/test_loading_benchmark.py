"""The loading benchmark (benchmarks/loading.py): models built with their parameters on the meta
device and materialised in the target dtype (never in fp32), and one step end to end on a tiny
model, through the report."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))   # the source tree, for `benchmarks`

from benchmarks import bigmodels, loading, loading_report, loading_steps  # noqa: E402


def test_models_are_built_on_meta_and_materialised_in_their_dtype(monkeypatch):
    transformers = pytest.importorskip("transformers")
    made = []
    empty = torch.empty

    def watched(*args, **kwargs):      # every real parameter is made in bf16
        t = empty(*args, **kwargs)
        made.append(t.dtype)
        return t
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, use_cache=False)
    with bigmodels.params_on_meta(torch.bfloat16):
        model = transformers.LlamaForCausalLM(config)
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())      # rotary frequencies, real
    monkeypatch.setattr(torch, "empty", watched)
    model = bigmodels.materialise(model, torch.device("cpu"))
    monkeypatch.undo()
    assert made and set(made) == {torch.bfloat16}
    assert all(not p.is_meta and p.dtype == torch.bfloat16 for p in model.parameters())
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert norms and all(torch.equal(p, torch.ones_like(p)) for p in norms)
    out = model(torch.randint(0, 64, (1, 8))).logits
    assert torch.isfinite(out.float()).all()


def test_load_step_and_report(tmp_path):
    import aotc
    model, x = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), torch.randn(4, 64)
    path = aotc.export(model, (x,), tmp_path / "m.aotc")
    rec = loading_steps.load(path, torch.device("cpu"), reps=2)
    for variant in ("verified", "unverified"):
        assert len(rec[variant]["runs"]["load"]) == 2
        assert 0 < rec[variant]["load"] <= rec[variant]["first"]
    results = {"meta": {"device": "cpu", "cpus": 2, "commit": "abc"},
               "limits": {"memcpy_1t": 5e9, "workers": 2},
               "models": {"tiny": {"dtype": "float32", "load": rec,
                                   "export": {"weights_bytes": 16640, "export_s": 1.0},
                                   "torch.compile": {"error": "boom\nlast line", "rc": 1}}}}
    text = loading_report.markdown(results)
    assert "| memcpy, 1 thread | 5.0 GB/s |" in text
    assert "| tiny | float32 |" in text and "- tiny torch.compile: last line" in text
    assert loading.dtype_of("bert", "cpu") == torch.float32
    assert loading.dtype_of("llama-7b", "cpu") == torch.bfloat16
