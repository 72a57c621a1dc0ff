"""--quantize int4: the numerics against a float64 reference, the packing round trip, exports
of an MLP (CPU, and CUDA through Triton's interpreter) and of a tiny LLaMA generator, the
stored layout checked at load, group sizes, and weight swaps that quantize the same way."""
from __future__ import annotations

import json

import pytest
import torch

import aotc
from aotc.errors import ArtifactError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.quant import dequantize, pack_int4, quantize, unpack_int4
from hostile import copy_artifact, edit_json


def _mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 192), torch.nn.GELU(),
                               torch.nn.Linear(192, 64)).eval().to(dtype)


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _reference(w: torch.Tensor, group: int):
    """int4 per group in float64: (values in [-7, 7], scales [N, K/G])."""
    g = w.double().reshape(w.shape[0], -1, group)
    s = g.abs().amax(dim=-1) / 7
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.round(g / s[..., None]).clamp(-7, 7).reshape(w.shape), s


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_per_group_matches_a_float64_reference(group):
    torch.manual_seed(1)
    w = torch.randn(24, 256) * torch.logspace(-3, 1, 24)[:, None]   # rows of very different range
    w[3] = 0.0                                                     # zero groups: scale 1, q 0
    w[5, 7] = 50.0                                                 # an outlier sets its group's
    q, s = quantize(w, "int4", group)
    q64, s64 = _reference(w, group)
    assert q.dtype == torch.uint8 and q.shape == (24, 128)
    assert s.dtype == torch.float32 and s.shape == (24, 256 // group)
    assert torch.allclose(s.double(), s64, rtol=1e-6)
    values = unpack_int4(q).double()
    assert (values - q64).abs().max() <= 1 and (values != q64).double().mean() < 1e-3
    assert values.min() >= -7 and values.max() <= 7          # symmetric: nibble 0 never written
    err = (dequantize(q, s, torch.float64) - w.double()).abs()
    step = s64.repeat_interleave(group, dim=1)
    assert (err <= step / 2 * (1 + 1e-5) + 1e-12).all()       # half a step at most
    assert float(err[5].max()) > float(err[4].max())          # the outlier's group is coarser
    assert torch.equal(quantize(w.to(torch.bfloat16), "int4", group)[0],
                       quantize(w.to(torch.bfloat16).float(), "int4", group)[0])


def test_packing_round_trips_and_puts_the_even_weight_low():
    nibbles = torch.randint(0, 16, (7, 64), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(0))
    packed = pack_int4(nibbles)
    assert packed.shape == (7, 32) and packed.dtype == torch.uint8
    assert torch.equal(packed[:, 0], nibbles[:, 0] | (nibbles[:, 1] << 4))
    assert torch.equal(unpack_int4(packed), nibbles.float() - 8)
    with pytest.raises(ValueError, match="multiple of the group size"):
        quantize(torch.randn(4, 96), "int4", 64)


@pytest.fixture(scope="module")
def int4_mlp(tmp_path_factory):
    model, x = _mlp(), torch.randn(8, 128)
    path = aotc.export(model, (x,), tmp_path_factory.mktemp("q4") / "mlp.aotc",
                       quantize="int4")
    return model, x, path


def test_mlp_int4_on_cpu_is_the_quantized_model(int4_mlp):
    from aotc.cli.report import inspect_text, verify_artifact
    model, x, path = int4_mlp
    m = aotc.load(path)
    q = m.manifest.quantization
    layer = q.layers["0.weight"]
    assert q.scheme == "int4" and layer.group_size == 64 and layer.shape == (192, 128)
    sd = m.state_dict()
    assert sd["0.weight_int4"].dtype == torch.uint8 and sd["0.weight_int4"].shape == (192, 64)
    assert sd["0.weight_scale"].shape == (192, 2) and "0.weight" not in sd
    with torch.no_grad():
        w0, w2 = (dequantize(sd[f"{i}.weight_int4"], sd[f"{i}.weight_scale"]) for i in (0, 2))
        want_q = torch.nn.functional.linear(torch.nn.functional.gelu(
            torch.nn.functional.linear(x.double(), w0.double(), model[0].bias.double())),
            w2.double(), model[2].bias.double())
        got, want = m(x), model(x)
    assert _rel(got, want_q) < 1e-5                 # the artifact computes the dequantized model
    rel = _rel(got, want)
    assert 0.02 < rel < 0.2 and abs(q.accuracy["rel_l2"] - rel) < 1e-3
    full = sum(p.numel() * 4 for p in model.parameters())
    assert m.manifest.weights.bytes < 0.2 * full   # a byte per two weights, a scale per 64
    text = inspect_text(path)
    assert "quantized: int4 weight-only, 2 layers" in text
    assert "int4 per group of 64" in text and "uint8 (packed int4)[192, 64]" in text
    assert "quantized int4: relative L2 error" in verify_artifact(m)


def test_load_state_dict_quantizes_like_export(int4_mlp, tmp_path):
    model, x, path = int4_mlp
    m = aotc.load(path)
    other = _mlp()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    m.load_state_dict(other.state_dict())
    fresh = aotc.load(aotc.export(other, (x,), tmp_path / "o.aotc", quantize="int4",
                                  prove=False))
    for k, v in fresh.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k
    assert torch.equal(m(x), fresh(x))
    m.load_state_dict(fresh.state_dict())               # already quantized: taken as is


@pytest.mark.parametrize("edit, match", [
    (lambda d: [d["quantization"]["layers"]["0.weight"].pop("group_size"), None][1],
     "group_size"),
    (lambda d: d["quantization"]["layers"]["0.weight"].update(group_size=48), "dividing K"),
    (lambda d: d["quantization"]["layers"]["0.weight"].update(group_size=32),
     "quantized layer '0.weight'"),                     # the plan reads [192, 2] scales
    (lambda d: d.update(format_version=24), "int4 in format version 26"),
])
def test_hostile_int4_fields_are_refused(int4_mlp, tmp_path, edit, match):
    _, _, path = int4_mlp
    bad = copy_artifact(path, tmp_path / "bad.aotc")
    edit_json(bad, fmt.MANIFEST, edit)
    with pytest.raises(ArtifactError, match=match):
        aotc.load(bad)


def test_group_size_options(tmp_path):
    model, x = _mlp(), torch.randn(2, 128)
    with pytest.raises(UsageError, match="--group-size applies to --quantize int4"):
        aotc.export(model, (x,), tmp_path / "a.aotc", quantize="int8", group_size=64)
    with pytest.raises(UsageError, match="--group-size 48"):
        aotc.export(model, (x,), tmp_path / "a.aotc", quantize="int4", group_size=48)
    path = aotc.export(model, (x,), tmp_path / "g.aotc", quantize="int4", group_size=128,
                       codegen=False)
    layers = aotc.load(path).manifest.quantization.layers
    assert set(layers) == {"0.weight"}      # 192 weights a row: not groups of 128, kept
    assert layers["0.weight"].stored_shapes == ((192, 64), (192, 1))


# ------------------------------------------------------------------ the decode kernel (CUDA)
def _stack():
    torch.manual_seed(0)     # K 2048 over 64 outputs: split K; 64 -> 200: one split, a tail
    return torch.nn.Sequential(torch.nn.Linear(2048, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 200)).eval()


@pytest.mark.parametrize("scheme, rows", [
    pytest.param("int4", 1, marks=pytest.mark.slow), ("int4", 3),
    pytest.param("int8", 2, marks=pytest.mark.slow),
    pytest.param("fp8", 1, marks=pytest.mark.slow)])   # each about 35 s on 2 cores
def test_decode_kernel_streams_the_stored_bytes_through_the_interpreter(tmp_path, scheme,
                                                                        rows):
    """1 to 8 rows on CUDA: aotc's quantized-weight kernel (codegen/triton/quant_mv.py) reads
    the stored int8 or packed int4 bytes, no float copy of a weight is made, and the product
    is the dequantized model's (float64 reference)."""
    model, x = _stack(), torch.randn(rows, 2048, generator=torch.Generator().manual_seed(3))
    path = aotc.export(model, (x,), tmp_path / "s.aotc", quantize=scheme, target="cuda:sm_90",
                       prove=False)
    plan = json.loads((path / "plans/forward.json").read_bytes())
    made = [s for s in plan["slots"] if s.get("producer")]
    assert not [s for s in made if s["shape"][-2:] in ([64, 2048], [2048, 64], [200, 64],
                                                       [64, 200])]
    texts = [p.read_text() for p in (path / "kernels").glob("*.py")]
    unpack = "lo = (p & 15)" if scheme == "int4" else "q = tl.load("
    assert sum(unpack in t for t in texts) == 2
    assert [s for s in made if s["dtype"] == "float32" and len(s["shape"]) == 3]  # split K
    m = aotc.load(path, device="cpu", interpret=True)
    sd = m.state_dict()
    w = [dequantize(sd[f"{i}.weight_{scheme}"], sd[f"{i}.weight_scale"], torch.float64)
         for i in (0, 2)]
    with torch.no_grad():
        h = torch.relu(x.double() @ w[0].T + model[0].bias.double())
        want = h @ w[1].T + model[2].bias.double()
        assert _rel(m(x), want) < 1e-5


def test_the_kernel_takes_only_what_computes_a_quantized_weight():
    """int4_source evaluates a lazy weight on random bytes: a body that reads the same two
    slots but computes something else (here: the nibbles swapped) is not taken."""
    from aotc.artifact.quant import dequantize_int4
    from aotc.codegen.ir import FloorDiv, ModIndex, sym
    from aotc.codegen.lowering.quantized import Evaluate
    p = torch.randint(0, 256, (2, 32), dtype=torch.uint8)
    s = torch.randn(2, 1)
    k, n = sym("k"), sym("n")
    ks, ns = torch.arange(64).repeat(2), torch.arange(2).repeat_interleave(64)
    h = Evaluate({k: ks, n: ns}, {"p": p, "s": s})

    def body(h, idx, swap=False):
        byte = h.load("p", idx[1] * 32 + FloorDiv(idx[0], 2))
        odd = h.op(h_op("EQ"), h.index_expr(ModIndex(idx[0], 2), torch.int64),
                   h.constant(0 if swap else 1, torch.int64))
        nib = h.op(h_op("WHERE"), odd, h.op(h_op("RSHIFT"), byte, h.constant(4, torch.uint8)),
                   h.op(h_op("BITWISE_AND"), byte, h.constant(15, torch.uint8)))
        v = h.op(h_op("SUB"), h.to_dtype(nib, torch.float32), h.constant(8.0, torch.float32))
        return h.op(h_op("MUL"), v, h.load("s", idx[1]))
    want = dequantize_int4(p, s).reshape(-1)
    assert torch.equal(body(h, (k, n)), want)
    assert not torch.equal(body(h, (k, n), swap=True), want)


def h_op(name):
    from aotc.codegen.ir import Op
    return getattr(Op, name)


def test_generator_int4_extern_only_records_its_accuracy(tmp_path):
    """samples/llama.py for decoding with int4, ATen calls only (fast): the layers chosen, the
    accuracy recorded and shown, generation runs."""
    from conftest import llama_sample
    model = llama_sample()
    ids = torch.randint(0, 500, (1, 6), generator=torch.Generator().manual_seed(2))
    path = aotc.export(model, (ids,), tmp_path / "g.aotc", decode=True, max_cache_len=16,
                       quantize="int4", codegen=False)
    art = aotc.load(path)
    layers = art.manifest.quantization.layers
    assert layers and all(layer.scheme == "int4" for layer in layers.values())
    assert not [k for k in layers if k.startswith("output")]      # the LM head stays
    a = art.manifest.quantization.accuracy
    assert a["tokens"] == 9 and 0 < a["rel_l2"] < 0.5
    assert art.generate(ids, 4).shape == (1, 10)


@pytest.mark.slow   # about 80 s on 2 cores
def test_tiny_llama_generator_int4_on_cpu(tmp_path):
    """A transformers LLaMA exported for decoding with int4 (groups of 32): every projection
    quantized, the LM head kept, the accuracy recorded, and the artifact's greedy tokens are
    the eager quantized model's."""
    transformers = pytest.importorskip("transformers")
    from aotc.exporter.generate import Generator, adapt, eager_generate
    from aotc.exporter.quantize import quantized, select
    from aotc.options import ExportOptions
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    path = aotc.export(model, (ids,), tmp_path / "llama.aotc", decode=True, max_cache_len=32,
                       quantize="int4", group_size=32)
    art = aotc.load(path)
    q = art.manifest.quantization
    assert len(q.layers) == 14 and "lm_head.weight" not in q.layers
    assert {layer.group_size for layer in q.layers.values()} == {32}
    assert q.accuracy["tokens"] > 0 and 0 < q.accuracy["rel_l2"] < 0.5
    opts = ExportOptions(decode=True, max_cache_len=32, quantize="int4", group_size=32)
    with quantized(model, select(model, opts), "int4", 32):
        want = eager_generate(Generator(adapt(model, 1, 32), 32), ids, 8)
    assert float((art.generate(ids, 8) == want).float().mean()) >= 0.9


# ------------------------------------------------------------------------------------- fp8
def test_fp8_per_channel_numerics():
    torch.manual_seed(2)
    w = torch.randn(16, 64) * torch.logspace(-2, 1, 16)[:, None]
    w[4] = 0.0
    q, s = quantize(w, "fp8")
    assert q.dtype == torch.float8_e4m3fn and s.shape == (16,) and s[4] == 1
    amax = w.abs().amax(dim=1)
    assert torch.allclose(s, torch.where(amax > 0, amax / 448, torch.ones(16)))
    assert float(q.float().abs().amax()) == 448.0                # the row's max hits e4m3's
    back = dequantize(q, s, torch.float64)
    rel = (back - w.double()).abs() / w.double().abs().clamp_min(1e-30)
    assert float(rel[w.abs() > s[:, None] * 2 ** -6].max()) <= 2 ** -4   # 3 mantissa bits


def test_fp8_is_refused_for_cpus_and_older_gpus(tmp_path):
    from aotc.errors import TargetError
    model, x = _mlp(), torch.randn(2, 128)
    with pytest.raises(TargetError, match="sm_89 or later; cpu") as info:
        aotc.export(model, (x,), tmp_path / "a.aotc", quantize="fp8")
    assert "int8 or int4" in info.value.fix
    with pytest.raises(TargetError, match="sm_80 has no e4m3") as info:
        aotc.export(model, (x,), tmp_path / "a.aotc", quantize="fp8", target="cuda:sm_90,sm_80")
    assert "sm_80" in info.value.found and not (tmp_path / "a.aotc").exists()
