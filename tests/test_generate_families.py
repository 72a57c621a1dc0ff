"""Decoders beyond LLaMA's shape exported as generators: sliding windows, soft-capped scores and
attention sinks (in aotc's own convention and in transformers' Gemma 2/3, Mistral, GPT-OSS),
mixtures of experts, transformers layers that do not pass their keyword arguments down to
attention, caches sized from what each layer stores rather than from its config, and the
models aotc's decoder cannot serve (an additive attention bias, attention outside
transformers' interface) refused with an AotcError that says so
(benchmarks/generate_families.py holds the families and the reasons). Greedy tokens must equal
transformers' own `generate` with a static cache (the plain-torch sample: its eager KVCache
path)."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.errors import AotcError
from benchmarks.generate_families import FAMILIES, MATCH, build, reference
from conftest import llama_sample

CACHE = 96
SERVED = [f for f, spec in FAMILIES.items() if spec[3] == MATCH]
REFUSED = [f for f, spec in FAMILIES.items() if spec[3] != MATCH]


def _matches_generate(tmp_path, family: str, n: int = 40, **load):
    pytest.importorskip("transformers")
    m = build(family)
    ids = torch.randint(1, 500, (2, 7), generator=torch.Generator().manual_seed(2))
    want = reference(m, ids, n)
    path = aotc.export(m, (ids,), tmp_path / f"{family}.aotc", decode=True, max_cache_len=CACHE)
    assert m.config._attn_implementation != "aotc"          # the model is left as it was
    assert not hasattr(m.config, "_aotc_context")
    got = aotc.load(path, **load).generate(ids, n)
    assert torch.equal(got, want), (got[:, 7:], want[:, 7:])
    return path


def test_gemma2_soft_capped_sliding_window_layers_match_generate(tmp_path):
    """Gemma 2 alternates sliding-window layers (a window of 8 here) with global ones, every
    one soft-capping its scores at 50: a sliding layer's cache is a ring of 8 slots, the global
    layer's holds every position, and each decode attention soft-caps."""
    import json
    path = _matches_generate(tmp_path, "gemma2")
    state = {s["name"]: s["shape"] for s in json.loads((path / "manifest.json").read_text())
             ["state"]}
    assert state["decoder.caches.0.k"][2] == 8 and state["decoder.caches.1.k"][2] == CACHE
    steps = json.loads((path / "plans" / "decode.json").read_text())["steps"]
    extra = {tuple(s["args"][-2:]) for s in steps
             if s.get("op", "").startswith("aotc::decode_attention")}
    assert extra == {(0, 50.0)}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "mistral_window", "mixtral",
                                    "gpt_oss", "deepseek_v2", "phi_head80", "llama4_chunked"])
def test_cuda_artifacts_through_the_triton_interpreter(tmp_path, family):
    """A CUDA artifact's kernels run by Triton's interpreter: flash decoding (with the window,
    the cap and the sinks: 6 + 14 positions, past the window of 8; keys of 24 and values of
    16, head sizes of 80, padded in registers), GPT-2's [K, N] weights stored transposed, the
    experts' gathered products, complex rotary embeddings computed as real pairs, and the
    ring caches of chunked attention."""
    pytest.importorskip("triton")
    m = build(family)
    ids = torch.randint(1, 500, (1, 6), generator=torch.Generator().manual_seed(3))
    want = reference(m, ids, 14)
    path = aotc.export(m, (ids,), tmp_path / "c.aotc", decode=True, max_cache_len=64,
                       target="cuda:sm_90")
    assert list(aotc.artifact.format.read_manifest(path).entries) == ["decode", "prefill"]
    got = aotc.load(path, device="cpu", interpret=True).generate(ids, 14)
    assert torch.equal(got, want)


def test_layers_that_drop_keyword_arguments_still_reach_the_cache(tmp_path):
    _matches_generate(tmp_path, "stablelm")          # its decoder layers pass no **kwargs


@pytest.mark.slow
@pytest.mark.parametrize("family", SERVED)
def test_more_families_match_generate(tmp_path, family):
    _matches_generate(tmp_path, family)


@pytest.mark.slow
def test_python_runner_matches_too(tmp_path):
    _matches_generate(tmp_path, "gemma3", runner="python")


@pytest.mark.parametrize("family", ["bloom", "mpt", "llama_window"])
def test_decoders_aotc_cannot_serve_are_refused(tmp_path, family):
    """ALiBi inside the model's own attention (BLOOM), a model that breaks with aotc's attention
    and cache (MPT), a window the config names that the attention never hears of (LLaMA's
    attention with a `sliding_window` in its config: a cache longer than it is refused, one
    within it exports)."""
    pytest.importorskip("transformers")
    m = build(family)
    ids = torch.randint(1, 500, (1, 5))
    with pytest.raises(AotcError) as info:
        aotc.export(m, (ids,), tmp_path / "m.aotc", decode=True, max_cache_len=CACHE)
    assert str(info.value).startswith(FAMILIES[family][3])
    assert m.config._attn_implementation != "aotc" and not hasattr(m.config, "_aotc_context")
    assert not (tmp_path / "m.aotc").exists()
    if family == "llama_window":
        aotc.export(m, (ids,), tmp_path / "ok.aotc", decode=True, max_cache_len=8)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(set(REFUSED) - {"bloom", "mpt", "llama_window"}))
def test_more_refusals(tmp_path, family):
    m = build(family)
    with pytest.raises(AotcError, match=FAMILIES[family][3].replace("(", r"\(")):
        aotc.export(m, (torch.randint(1, 500, (1, 5)),), tmp_path / "m.aotc", decode=True,
                    max_cache_len=CACHE)


@pytest.mark.parametrize("runner", ["cpp", "python"])
def test_sample_with_a_window_a_softcap_and_sinks_generates_as_eagerly(tmp_path, runner):
    from aotc.exporter.generate import Generator, adapt, eager_generate
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    kw = dict(window=6, softcap=3.0, sinks=True)
    model = llama_sample(**kw)
    want = eager_generate(Generator(adapt(llama_sample(**kw), 2, CACHE), CACHE), ids, 40)
    plain = eager_generate(Generator(adapt(llama_sample(), 2, CACHE), CACHE), ids, 40)
    assert not torch.equal(want, plain)      # the window, the cap and the sinks change tokens
    path = aotc.export(model, (ids,), tmp_path / "w.aotc", decode=True, max_cache_len=CACHE)
    m = aotc.load(path, runner=runner)
    assert torch.equal(m.generate(ids, 40), want)


def test_mixtral_experts_match_generate(tmp_path):
    """transformers runs the experts through its grouped product (a custom op on CPUs, ATen's
    _grouped_mm elsewhere); export decomposes it into one reduction per projection that reads
    the selected experts' weights, and the gathered weights are never materialized."""
    import json
    path = _matches_generate(tmp_path, "mixtral")
    for entry in ("prefill", "decode"):
        plan = json.loads((path / "plans" / f"{entry}.json").read_text())
        assert not [s for s in plan["steps"] if "grouped_mm" in str(s.get("op"))]
        made = {o for s in plan["steps"] for o in s.get("out", [])}     # slots steps write
        shapes = [s["shape"] for s in plan["slots"] if s["id"] in made]
        assert not [s for s in shapes if len(s) == 3 and s[0] != 4 and s[1:] in (
            [64, 256], [128, 64], [256, 64], [64, 128])], shapes    # [rows, K, N] weight copies


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_product_decomposition_matches_a_loop_over_groups(dtype):
    """Rows sorted by expert, offsets cumulative: empty groups, one row per group, rows past the
    last offset (expert-parallel sentinels: any finite value)."""
    from aotc.exporter.decomp import _grouped_mm
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 16, generator=g).to(dtype)
    w = torch.randn(5, 16, 8, generator=g).to(dtype)
    offs = torch.tensor([2, 2, 3, 7, 7], dtype=torch.int32)    # groups of 2, 0, 1, 4, 0 rows
    got = _grouped_mm(x, w, offs)
    want, start = torch.empty(9, 8, dtype=dtype), 0
    for e, end in enumerate(offs.tolist()):
        want[start:end] = (x[start:end].double() @ w[e].double()).to(dtype)
        start = end
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[:7], want[:7], **tol)
    assert got.dtype == dtype and torch.isfinite(got[7:]).all()


def test_a_ring_cache_generates_what_recomputing_the_whole_sequence_does(tmp_path):
    """A sliding-window layer's ring of 4 slots against the model run without any cache on
    the whole sequence each step (its own causal window mask): prompts shorter and longer than
    the window, one artifact (the prompt length is dynamic), both runners."""
    import json
    path = aotc.export(llama_sample(window=4), (torch.randint(0, 500, (2, 10)),),
                       tmp_path / "r.aotc", decode=True, max_cache_len=CACHE)
    shapes = {s["shape"][2] for s in json.loads((path / "manifest.json").read_text())["state"]
              if s["name"].endswith(".k")}
    assert shapes == {4}
    _generates_as_recomputed(path, llama_sample(window=4))   # no setup_caches: no cache at all


def _generates_as_recomputed(path, plain):
    """The artifact's greedy tokens, with both runners, against `plain` (the model without
    caches) run on the whole sequence each step: prompts of 3 and 10 tokens, 20 new ones."""
    for t in (3, 10):
        ids = torch.randint(0, 500, (2, t), generator=torch.Generator().manual_seed(t))
        want = ids
        with torch.no_grad():
            for _ in range(20):
                want = torch.cat([want, plain(want)[:, -1].argmax(-1, keepdim=True)], 1)
        for runner in ("cpp", "python"):
            assert torch.equal(aotc.load(path, runner=runner).generate(ids, 20), want), (t, runner)


class _Chunked(torch.nn.Module):
    """One attention layer with chunked attention of 4 positions (Llama 4's), in aotc's
    convention: with caches a ring of 4 slots, without them a mask of each token's chunk."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(500, 32)
        self.qkv = torch.nn.Linear(32, 3 * 32)
        self.out = torch.nn.Linear(32, 500)
        self.cache = None

    def setup_caches(self, batch_size, max_cache_len):
        self.cache = aotc.nn.KVCache(batch_size, 2, max_cache_len, 16, chunk=4)

    def forward(self, input_ids, input_pos=None):
        from aotc.nn import attention, window_mask
        b, t = input_ids.shape
        pos = torch.arange(t) if input_pos is None else input_pos
        q, k, v = (x.view(b, t, 2, 16).transpose(1, 2)
                   for x in self.qkv(self.embed(input_ids)).chunk(3, -1))
        if self.cache is not None:
            k, v = self.cache.update(pos, k, v)
            y = self.cache.attend(q, k, v, pos)
        else:
            y = attention(q, k, v, window_mask(pos[:, None], pos, chunk=4)[None, None], 0.25)
        return self.out(y.transpose(1, 2).reshape(b, t, 32))


def test_chunked_attention_generates_what_recomputing_the_whole_sequence_does(tmp_path):
    """Chunked attention's ring of 4 slots (a step at position p attends slots 0..p % 4, the
    keys of its own chunk) against the model run without a cache on the whole sequence:
    prompts inside one chunk and across three, one artifact, both runners."""
    import json
    path = aotc.export(_Chunked().eval(), (torch.randint(0, 500, (2, 10)),),
                       tmp_path / "c.aotc", decode=True, max_cache_len=CACHE)
    state = json.loads((path / "manifest.json").read_text())["state"]
    assert {s["shape"][2] for s in state if s["name"].endswith(".k")} == {4}
    _generates_as_recomputed(path, _Chunked().eval())


def test_an_eager_adapter_keeps_working_after_the_same_model_is_exported(tmp_path):
    """The generation benchmark's eager baseline adapts the model it then exports: the export's
    adapter gives the configs back what the first one set, so both run (GPT-2 failed at its
    first eager prefill after the export)."""
    pytest.importorskip("transformers")
    from aotc.exporter.generate import Generator, PrefillStep, adapt
    m = build("gpt2")
    ids = torch.randint(1, 500, (1, 5), generator=torch.Generator().manual_seed(3))
    eager = PrefillStep(Generator(adapt(m, 1, CACHE), CACHE))
    with torch.no_grad():
        before = eager(ids)
    aotc.export(m, (ids,), tmp_path / "g.aotc", decode=True, max_cache_len=CACHE)
    with torch.no_grad():
        torch.testing.assert_close(eager(ids), before)
    eager.g.decoder.release()
    assert not hasattr(m.config, "_aotc_context")     # the first adapter's release: as it was
