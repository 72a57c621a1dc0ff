"""A one-row product whose x is normalized by row statistics (RMSNorm, LayerNorm) computes them
in each of its programs (codegen/lowering/row_statistics.py): no norm kernel of one program, no
stored normalized row. Run by Triton's interpreter against float64 eager; whole generators'
greedy tokens against transformers' own; the kernels a CUDA decode layer launches counted."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import aotc

pytest.importorskip("triton")
CUDA = {"target": "cuda:sm_90"}


class NormProducts(torch.nn.Module):
    """h + r (a residual add), normalized, then two projections of it (q and k, or gate and
    up): the shape of a decoder layer's input of its attention or its MLP."""

    def __init__(self, k: int, n: int, kind: str, weight: bool, eps: float):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.kind, self.eps, self.k = kind, eps, k
        self.w = torch.nn.Parameter(1 + torch.randn(k, generator=g) / 4) if weight else None
        self.b = torch.nn.Parameter(torch.randn(k, generator=g) / 4) \
            if weight and kind == "layer" else None
        self.p1 = torch.nn.Parameter(torch.randn(n, k, generator=g) / k ** 0.5)
        self.p2 = torch.nn.Parameter(torch.randn(n, k, generator=g) / k ** 0.5)

    def forward(self, h, r):
        x = h + r
        if self.kind == "rms":       # LLaMA's: in float32, rounded, then the weight
            y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
            y = y.to(x.dtype) * self.w if self.w is not None else y.to(x.dtype)
        elif self.kind == "rms_op":
            y = F.rms_norm(x, (self.k,), self.w, self.eps)
        else:
            y = F.layer_norm(x, (self.k,), self.w, self.b, self.eps)
        return y @ self.p1.t(), F.silu(y @ self.p2.t())


def _kernels(path) -> list:
    plan = json.loads((path / "plans" / "forward.json").read_text())
    return [s for s in plan["steps"] if s["kind"] == "kernel"]


def _one_program_norms(path, entry: str = "forward") -> list:
    out = []
    for s in json.loads((path / "plans" / f"{entry}.json").read_text())["steps"]:
        if s["kind"] != "kernel":
            continue
        spec = json.loads((path / "kernels" / f"{s['name']}.json").read_text())
        text = (path / "kernels" / f"{s['name']}.py").read_text()
        if spec["grid"] == ["1", "1", "1"] and "tl.rsqrt(" in text and "matvec" not in text:
            out.append(s["name"])
    return out


CASES = [  # kind, weight, eps, K, dtype
    ("rms", True, 1e-5, 112, torch.float32),
    ("rms", True, 1e-6, 112, torch.bfloat16),
    ("rms", False, 1e-5, 96, torch.bfloat16),
    ("rms_op", True, 1e-6, 112, torch.float32),
    ("rms_op", False, 1e-3, 112, torch.bfloat16),
    ("layer", True, 1e-5, 112, torch.bfloat16),
    ("layer", False, 1e-6, 96, torch.float32),
]


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("kind,weight,eps,k,dtype", CASES,
                         ids=[f"{c[0]}-{'w' if c[1] else 'nw'}-{c[2]}-{c[3]}-{str(c[4])[6:]}"
                              for c in CASES])
def test_norms_in_the_products_that_read_them(tmp_path, rows, kind, weight, eps, k, dtype):
    """One row: the statistics, both products and the SiLU in one kernel; 8 rows (vendor or
    few-rows products) as before. Against float64 eager of the same (rounded) values."""
    model = NormProducts(k, 40, kind, weight, eps).eval().to(dtype)
    g = torch.Generator().manual_seed(1)
    h, r = (torch.randn(rows, k, generator=g).to(dtype) * 3 for _ in range(2))
    path = aotc.export(model, (h, r), tmp_path / "m.aotc", **CUDA)
    if rows == 1:
        kernels = _kernels(path)
        assert len(kernels) == 1, [s["name"] for s in kernels]
        assert not _one_program_norms(path)
    got = aotc.load(path, device="cpu", interpret=True)(h, r)
    want = model.double()(h.double(), r.double())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=5e-2)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), b, **tol)


def test_a_vector_that_is_no_norm_is_stored_once(tmp_path):
    """x = SiLU(h) * h reads no statistic: stored once by its own kernel, as before."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.randn(40, 64) / 8)

        def forward(self, h):
            return (F.silu(h) * h) @ self.p.t()
    model, h = M().eval(), torch.randn(1, 64)
    path = aotc.export(model, (h,), tmp_path / "m.aotc", **CUDA)
    assert len(_kernels(path)) == 2
    got = aotc.load(path, device="cpu", interpret=True)(h)
    torch.testing.assert_close(got, model(h), rtol=1e-4, atol=1e-4)


def _hf(family: str):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    small = dict(vocab_size=256, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                 num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128)
    m = (tf.LlamaForCausalLM(tf.LlamaConfig(**small)) if family == "llama" else
         tf.Qwen2ForCausalLM(tf.Qwen2Config(tie_word_embeddings=True, **small))).eval()
    m.generation_config.eos_token_id = None
    return m


def kernels_per_layer(path) -> list[int]:
    """The kernels a decode step launches between one layer's attention and the next's."""
    steps = json.loads((path / "plans" / "decode.json").read_text())["steps"]
    kernels = [s for s in steps if s["kind"] == "kernel"]
    specs = [json.loads((path / "kernels" / f"{s['name']}.json").read_text()) for s in kernels]
    split = [i for i, (s, spec) in enumerate(zip(kernels, specs))
             if any("flash-decoding" in r for r in s.get("reasons", []))]
    assert len(split) >= 2, "one split attention kernel a layer"
    return [b - a for a, b in zip(split, split[1:])]


def _decoder(tmp_path, family):
    """(model, prompt, CUDA decode artifact) of a tiny transformers decoder."""
    m = _hf(family)
    ids = torch.randint(1, 256, (1, 5), generator=torch.Generator().manual_seed(3))
    path = aotc.export(m, (ids,), tmp_path / "g.aotc", decode=True, max_cache_len=16, **CUDA)
    return m, ids, path


@pytest.mark.parametrize("family", [pytest.param("llama", marks=pytest.mark.slow), "qwen2"])
def test_cuda_decoders_launch_six_kernels_a_layer(tmp_path, family):
    """A decode layer: the q/k/v product (computing the input norm), the attention's split and
    combine kernels, the output projection, the gate/up product (computing the post-attention
    norm) and the down projection: 6 where main launched 8 (each norm a kernel of one program;
    9 for Qwen2, whose q/k/v products with biases were two)."""
    _, _, path = _decoder(tmp_path, family)
    assert kernels_per_layer(path) == [6]
    assert not _one_program_norms(path, "decode")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_cuda_decoders_with_fused_norms_generate_as_eagerly(tmp_path, family):
    """Greedy tokens equal transformers' (GQA 6/2; Qwen2's q/k/v biases and tied head),
    through the interpreter."""
    m, ids, path = _decoder(tmp_path, family)
    with torch.no_grad():
        want = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                          do_sample=False, cache_implementation="static", pad_token_id=0)
    got = aotc.load(path, device="cpu", interpret=True).generate(ids, 5)
    assert torch.equal(got, want), (got[:, 5:], want[:, 5:])
