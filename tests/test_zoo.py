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


def test_a_sweep_runs_each_model_at_the_first_input_size_it_takes(monkeypatch):
    # a sweep's model is built from its library's registry: asked for the small size first,
    # then at the small size without asking, then at the model's own size
    import torch
    from torch import nn

    from benchmarks import zoo_sweep

    class Fixed(nn.Module):       # a position table of its own size: refuses other inputs
        def __init__(self, img_size=32):
            super().__init__()
            self.pos = nn.Parameter(torch.zeros(3, img_size, img_size))

        def forward(self, x):
            return (x + self.pos).mean((1, 2, 3))

    def build(name, kwargs):
        if name == "asks" or "img_size" not in kwargs:
            return Fixed(**kwargs)
        raise TypeError("unexpected keyword argument 'img_size'")
    monkeypatch.setitem(zoo_sweep.BUILDERS, "timm-sweep", build)
    monkeypatch.setattr(zoo_sweep, "_default", lambda family, name: (3, 32, 32))
    zoo_sweep.shape.cache_clear()
    small = (3, zoo_sweep.SMALL_RES[0], zoo_sweep.SMALL_RES[0])
    assert zoo_sweep.shape("timm-sweep", "asks", "small") == ({"img_size": 96}, small)
    assert zoo_sweep.shape("timm-sweep", "fixed", "small") == ({}, (3, 32, 32))
    assert zoo_sweep.shape("timm-sweep", "fixed", "full") == ({}, (3, 32, 32))
    spec = zoo_sweep.sweep_spec("timm-sweep", "asks")
    model, (x,) = spec.make("small", "latency")
    assert x.shape == (spec.batch("small", "latency"), *small) and model(x).shape == x.shape[:1]
    zoo_sweep.shape.cache_clear()


def test_the_transformers_sweep_shrinks_each_size_field_a_config_has():
    # a default config's size fields shrink to a CPU size, through its own constructor (what it
    # derives follows); fields it lacks stay absent; special tokens fit the smaller vocabulary
    pytest.importorskip("transformers")
    from transformers import BertConfig, LlamaConfig

    from benchmarks import zoo_hf_sweep as z
    bert = z.shrunk(BertConfig(vocab_size=30522, pad_token_id=30000))
    assert (bert["hidden_size"], bert["num_hidden_layers"], bert["num_attention_heads"],
            bert["intermediate_size"], bert["vocab_size"]) == (64, 2, 4, 128, 1000)
    assert bert["pad_token_id"] < 1000 and "num_key_value_heads" not in bert
    llama = LlamaConfig(**z.shrunk(LlamaConfig(num_key_value_heads=8)))
    assert (llama.num_key_value_heads, llama.head_dim, llama.num_hidden_layers) == (2, 16, 2)
    assert z.shrunk(LlamaConfig(num_key_value_heads=1))["num_key_value_heads"] == 1
    assert z.shrunk(LlamaConfig(num_hidden_layers=1))["num_hidden_layers"] == 1


def test_the_transformers_sweep_keeps_one_layer_of_each_kind():
    # a hybrid's per-layer list is cut to the shrunk depth keeping each kind of layer (a model
    # without its attention layer is refused by its config); the depth grows to the kinds
    from benchmarks import zoo_hf_sweep as z

    class Hybrid:
        def to_dict(self):
            return {"num_hidden_layers": 6, "hidden_size": 256,
                    "layer_types": ["mamba", "mamba", "mamba", "attention", "mamba", "moe"]}
    out = z.shrunk(Hybrid())
    assert out["layer_types"] == ["mamba", "attention", "moe"] and out["num_hidden_layers"] == 3
    out = z.shrunk(type("Plain", (), {"to_dict": lambda self: {
        "num_hidden_layers": 4, "layer_types": ["full"] * 4}})())
    assert out["layer_types"] == ["full", "full"] and out["num_hidden_layers"] == 2
