"""--quantize int8: the numerics, exports of an MLP and of decoders (CPU and, through Triton's
interpreter, CUDA), skip patterns, the accuracy recorded and enforced, hostile quantized
artifacts refused typed, and weight swaps that quantize a full-precision state dict."""
from __future__ import annotations

import json

import pytest
import torch

import aotc
from aotc.errors import ArtifactError, ExportError, StateDictError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.quant import dequantize, quantize
from conftest import llama_sample
from hostile import copy_artifact, edit_json

torch.manual_seed(0)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(),
                               torch.nn.Linear(96, 32)).eval()


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_int8_per_channel_matches_a_float64_reference():
    w = torch.randn(48, 80) * torch.logspace(-3, 1, 48)[:, None]   # rows of very different range
    w[5] = 0.0                                                     # a zero row: scale 1, q 0
    w[7, 3] = 40.0                                                 # an outlier sets its row's scale
    q, s = quantize(w)
    w64 = w.double()
    s64 = w64.abs().amax(dim=1) / 127
    s64[5] = 1.0
    q64 = torch.round(w64 / s64[:, None]).clamp(-127, 127)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (48,)
    assert torch.allclose(s.double(), s64, rtol=1e-6)
    assert (q.double() - q64).abs().max() <= 1     # float32 division: a tie may round apart
    assert (q.double() != q64).float().mean() < 1e-3
    err = (dequantize(q, s, torch.float64) - w64).abs()
    assert (err <= s64[:, None] / 2 * (1 + 1e-5) + 1e-12).all()   # half a step at most
    assert int(q.abs().max()) == 127 and torch.equal(q[5], torch.zeros(80, dtype=torch.int8))
    q16, s16 = quantize(w.to(torch.bfloat16).float())
    qb, sb = quantize(w.to(torch.bfloat16))
    assert torch.equal(q16, qb) and torch.equal(s16, sb)   # computed in float32 for every dtype


@pytest.fixture(scope="module")
def int8_mlp(tmp_path_factory):
    model, x = _mlp(), torch.randn(8, 64)
    path = aotc.export(model, (x,), tmp_path_factory.mktemp("q") / "mlp.aotc", quantize="int8")
    return model, x, path


def test_mlp_int8_on_cpu_is_within_quantization_error(int8_mlp):
    model, x, path = int8_mlp
    m = aotc.load(path)
    q = m.manifest.quantization
    assert set(q.layers) == {"0.weight", "2.weight"}
    assert q.layers["0.weight"].shape == (96, 64)
    sd = m.state_dict()
    assert sd["0.weight_int8"].dtype == torch.int8 and sd["0.weight_scale"].shape == (96,)
    assert "0.weight" not in sd and "0.bias" in sd
    with torch.no_grad():
        want = model(x)
    rel = _rel(m(x), want)
    assert 1e-5 < rel < 0.02                      # quantized (not the float weights), and close
    assert abs(q.accuracy["rel_l2"] - rel) < 1e-3   # what export measured is what it does
    assert m.manifest.weights.bytes < 0.4 * sum(p.numel() * 4 for p in model.parameters())


def test_one_row_on_cpu_reads_the_int8_weights_in_a_cpp_reduction(tmp_path):
    model, x = _mlp(), torch.randn(1, 64)
    path = aotc.export(model, (x,), tmp_path / "r.aotc", quantize="int8")
    plan = json.loads((path / "plans/forward.json").read_bytes())
    assert not [s for s in plan["steps"] if s.get("op") == "aten::mm.default"]
    assert not [s for s in plan["slots"] if s.get("producer") and len(s["shape"]) == 2
                and s["shape"][0] * s["shape"][1] >= 32 * 96]
    assert "int8_t" in (path / "kernels/kernels.cpp").read_text()
    with torch.no_grad():
        assert _rel(aotc.load(path)(x), model(x)) < 0.02


def test_mlp_int8_for_cuda_runs_through_the_interpreter(tmp_path):
    model, x = _mlp(), torch.randn(1, 64)     # one row: the matrix-vector kernel reads int8
    path = aotc.export(model, (x,), tmp_path / "mlp.aotc", quantize="int8",
                       target="cuda:sm_90")
    plan = json.loads((path / "plans/forward.json").read_bytes())
    assert not [s for s in plan["steps"] if s.get("op") == "aten::mm.default"]
    int8 = {s["id"] for s in plan["slots"] if s.get("dtype") == "int8"}
    assert len(int8) == 2 and all(s["kind"] == "weight" for s in plan["slots"] if s["id"] in int8)
    # the kernels read the int8 weights themselves: no float copy of a weight is ever made
    assert not [s for s in plan["slots"] if s["kind"] == "value" and s.get("producer")
                and len(s["shape"]) == 2 and s["shape"][0] * s["shape"][1] >= 32 * 96]
    m = aotc.load(path, device="cpu", interpret=True)
    with torch.no_grad():
        assert _rel(m(x), model(x)) < 0.02


def test_few_rows_in_bf16_stream_the_int8_weights_for_cuda(tmp_path):
    """Decode at a small batch: the few-rows products (codegen/lowering/matvec.py, which fuse
    what is around them; codegen/lowering/quantized.py says why int8 goes there on GPUs) load
    the int8 weights themselves and convert them in registers; no float copy of a weight is
    made."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.GELU(),
                                torch.nn.Linear(384, 128)).eval().to(torch.bfloat16)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    path = aotc.export(model, (x,), tmp_path / "b.aotc", quantize="int8", target="cuda:sm_90",
                       prove=False)
    plan = json.loads((path / "plans/forward.json").read_bytes())
    weights = {s["id"] for s in plan["slots"] if s.get("dtype") == "int8"}
    assert len(weights) == 2
    assert not [s for s in plan["slots"] if s.get("producer") and len(s["shape"]) == 2
                and s["shape"][0] * s["shape"][1] >= 128 * 384]
    sources = [p.read_text() for p in (path / "kernels").glob("*.py")]
    loaded = {int(part.split(" ")[0]) for text in sources
              for part in text.split("tl.load(buf")[1:]}
    assert weights <= loaded
    m = aotc.load(path, device="cpu", interpret=True)
    with torch.no_grad():
        assert _rel(m(x).float(), model.float()(x.float())) < 0.02


def test_skip_patterns_keep_weights_in_full_precision(tmp_path):
    model, x = _mlp(), torch.randn(4, 64)
    path = aotc.export(model, (x,), tmp_path / "a.aotc", quantize="int8", quantize_skip="2.*",
                       codegen=False)
    m = aotc.load(path)
    assert set(m.manifest.quantization.layers) == {"0.weight"}
    assert m.state_dict()["2.weight"].dtype == torch.float32
    with pytest.raises(UsageError, match="no layer to quantize"):
        aotc.export(model, (x,), tmp_path / "b.aotc", quantize="int8", quantize_skip="*")


def test_options_are_checked_before_any_work(tmp_path):
    model, x = _mlp(), torch.randn(4, 64)
    with pytest.raises(UsageError, match="--quantize-skip applies to quantized"):
        aotc.export(model, (x,), tmp_path / "a.aotc", quantize_skip="*")
    with pytest.raises(UsageError, match="unknown quantization"):
        aotc.export(model, (x,), tmp_path / "a.aotc", quantize="int3")
    with pytest.raises(UsageError, match="--train"):
        aotc.export(model, (x,), tmp_path / "a.aotc", quantize="int8", train=True)


def test_max_quant_error_refuses_with_the_measured_value(tmp_path):
    model, x = _mlp(), torch.randn(4, 64)
    with pytest.raises(ExportError, match="above --max-quant-error 1e-06") as info:
        aotc.export(model, (x,), tmp_path / "a.aotc", quantize="int8", max_quant_error=1e-6)
    assert 1e-4 < info.value.found < 0.05
    assert not (tmp_path / "a.aotc").exists()


def test_load_state_dict_quantizes_a_full_precision_state_dict(int8_mlp, tmp_path):
    model, x, path = int8_mlp
    m = aotc.load(path)
    other = _mlp()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    m.load_state_dict(other.state_dict())
    fresh = aotc.load(aotc.export(other, (x,), tmp_path / "o.aotc", quantize="int8",
                                  prove=False))
    for k, v in fresh.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k        # one quantize function
    assert torch.equal(m(x), fresh(x))
    m.load_state_dict(fresh.state_dict())                   # already quantized: taken as is
    with pytest.raises(StateDictError, match="size mismatch"):
        m.load_state_dict({**other.state_dict(), "0.weight": torch.randn(3, 64)})


def test_swap_weights_quantizes_too(int8_mlp, tmp_path):
    from safetensors.torch import save_file
    from aotc.runtime.swap import swap_weights
    model, x, path = int8_mlp
    other = _mlp()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.25)
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, tmp_path / "w.st")
    out, _ = swap_weights(path, tmp_path / "w.st", tmp_path / "swapped.aotc")
    swapped = aotc.load(out)
    assert swapped.state_dict()["0.weight_int8"].dtype == torch.int8
    with torch.no_grad():
        assert _rel(swapped(x), other(x)) < 0.02


# -------------------------------------------------------------------------- hostile artifacts
def _layer(doc):
    return doc["quantization"]["layers"]["0.weight"]


@pytest.mark.parametrize("edit, match", [
    (lambda d: _layer(d).update(shape=[97, 64]), "quantized layer '0.weight'"),
    (lambda d: _layer(d).update(dtype="int8"), "float"),
    (lambda d: _layer(d).update(scale="0.bias"), "stored names"),
    (lambda d: d["quantization"]["layers"].update({"9.weight": dict(
        _layer(d), weight="9.weight_int8", scale="9.weight_scale")}), "a stored tensor"),
    (lambda d: _layer(d).update(scale=_layer(d)["weight"]), "distinct"),
    (lambda d: _layer(d).update(scheme="int4"), "int8"),
    (lambda d: d["quantization"].update(accuracy=[1]), "object"),
    (lambda d: d.update(format_version=23), "format version 24"),   # 20-23 know the rest
])
def test_hostile_quantization_fields_are_refused(int8_mlp, tmp_path, edit, match):
    _, _, path = int8_mlp
    bad = copy_artifact(path, tmp_path / "bad.aotc")
    edit_json(bad, fmt.MANIFEST, edit)
    with pytest.raises(ArtifactError, match=match):
        aotc.load(bad)


def test_a_plan_reading_scales_of_another_dtype_is_refused(int8_mlp, tmp_path):
    _, _, path = int8_mlp
    bad = copy_artifact(path, tmp_path / "bad.aotc")

    def scale_as_half(plan):
        for slot in plan["slots"]:
            if slot.get("weight") == "0.weight_scale":
                slot["dtype"] = "float16"
    edit_json(bad, "plans/forward.json", scale_as_half)
    with pytest.raises(ArtifactError, match="scale of quantized layer '0.weight'"):
        aotc.load(bad)


def test_artifacts_without_the_field_load_as_before(tmp_path):
    model, x = _mlp(), torch.randn(2, 64)
    path = aotc.export(model, (x,), tmp_path / "a.aotc")
    doc = json.loads((path / fmt.MANIFEST).read_bytes())
    assert "quantization" not in doc
    assert aotc.load(path).manifest.quantization is None


# ---------------------------------------------------------------------------------- decoders
def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


def _agreement(art, model, ids, n):
    """The fraction of greedy steps where the artifact and the float model agree."""
    got = art.generate(ids, n)[:, ids.shape[1]:]
    want = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n,
                          pad_token_id=0)[:, ids.shape[1]:]
    return float((got == want).float().mean())


def test_tiny_llama_decoder_int8_on_cpu(tmp_path):
    model = _tiny_llama()
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    path = aotc.export(model, (ids,), tmp_path / "llama.aotc", decode=True, max_cache_len=32,
                       quantize="int8", quantize_skip="*.o_proj.weight")
    art = aotc.load(path)
    q = art.manifest.quantization
    names = set(q.layers)
    assert "lm_head.weight" not in names                     # the LM head: full precision
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert "model.layers.0.self_attn.o_proj.weight" not in names
    assert q.accuracy["tokens"] > 0 and q.accuracy["rel_l2"] < 0.05
    assert q.accuracy["tokens_agree"] >= 0.75 * q.accuracy["tokens"]
    assert _agreement(art, model, ids, 12) >= 0.75
    from aotc.cli.report import verify_artifact
    assert "greedy tokens agree" in verify_artifact(art)


def test_decoder_int8_records_tokens_and_quantizes_what_was_asked(tmp_path):
    """An ATen-only generator (no kernels to build): the layers chosen, the accuracy fields."""
    model = llama_sample()
    ids = torch.randint(0, 500, (1, 6), generator=torch.Generator().manual_seed(2))
    path = aotc.export(model, (ids,), tmp_path / "g.aotc", decode=True, max_cache_len=16,
                       quantize="int8", quantize_embeddings=True, codegen=False)
    art = aotc.load(path)
    layers = art.manifest.quantization.layers
    assert {layer.kind for layer in layers.values()} == {"linear", "embedding"}
    assert not [k for k in layers if k.startswith("output")]      # the LM head stays
    assert art.state_dict()[next(iter(layers)) + "_int8"].dtype == torch.int8
    a = art.manifest.quantization.accuracy
    assert a["tokens"] == 9 and a["tokens_agree"] >= 6 and a["rel_l2"] < 0.05
    from aotc.cli.report import verify_artifact
    assert "greedy tokens agree" in verify_artifact(art)


@pytest.mark.slow   # about 5 minutes on 2 cores: Triton's interpreter over two entries
def test_aotc_decoder_int8_for_cuda_with_embeddings_and_head(tmp_path):
    model = llama_sample()
    ids = torch.randint(0, 500, (1, 6), generator=torch.Generator().manual_seed(2))
    path = aotc.export(model, (ids,), tmp_path / "g.aotc", decode=True, max_cache_len=16,
                       quantize="int8", quantize_embeddings=True, quantize_lm_head=True,
                       target="cuda:sm_90")
    q = aotc.load(path, device="cpu", interpret=True)
    kinds = {layer.kind for layer in q.manifest.quantization.layers.values()}
    assert kinds == {"linear", "embedding"}
    a = q.manifest.quantization.accuracy
    assert a["tokens_agree"] >= 0.75 * a["tokens"]
    got = q.generate(ids, 6)
    from aotc.exporter.generate import Generator, adapt, eager_generate
    model = llama_sample()
    want = eager_generate(Generator(adapt(model, 1, 16), 16), ids, 6)
    assert float((got == want).float().mean()) >= 0.75
