"""Generators (`--decode`): prefill and decode entries over a static KV cache. Greedy tokens
must equal eager generation token for token (transformers' own generate with a static cache
for transformers models; the model's eager KVCache path for the plain-torch sample), on the CPU
and through the Triton kernels of a CUDA artifact; the state is guarded, reset and never
aliased by outputs."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.errors import ArtifactError, GuardError, UsageError
from aotc.artifact import format as fmt
from conftest import SAMPLES_DIR, llama_sample, run_aotc
from hostile import copy_artifact, edit_json

CACHE = 96


def _hf(family: str):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    small = dict(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=256)
    make = {"llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=2, **small)),
            "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(num_key_value_heads=2, **small)),
            "gemma": lambda: tf.GemmaForCausalLM(tf.GemmaConfig(num_key_value_heads=1,
                                                                head_dim=16, **small)),
            "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(
                num_key_value_heads=2, sliding_window=None, **small)),
            "phi3": lambda: tf.Phi3ForCausalLM(tf.Phi3Config(num_key_value_heads=2,
                                                             pad_token_id=0, **small)),
            "phi": lambda: tf.PhiForCausalLM(tf.PhiConfig(**small)),
            "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=500, n_embd=64, n_layer=2,
                                                             n_head=4, n_positions=256))}
    m = make[family]().eval()
    m.generation_config.eos_token_id = None
    return m


def _hf_reference(m, ids, n):
    with torch.no_grad():
        return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                          do_sample=False, cache_implementation="static", pad_token_id=0)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    model = llama_sample()
    ids = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    path = aotc.export(model, (ids,), tmp_path_factory.mktemp("g") / "llama.aotc", decode=True,
                       max_cache_len=CACHE)
    return model, ids, path


def _eager_tokens(model, ids, n):
    from aotc.exporter.generate import Generator, adapt, eager_generate
    return eager_generate(Generator(adapt(model, ids.shape[0], CACHE), CACHE), ids, n)


def test_sample_generates_what_it_generates_eagerly(sample):
    model, ids, path = sample
    m = aotc.load(path)
    want = _eager_tokens(llama_sample(), ids, 64)
    got = m.generate(ids, 64)
    assert got.dtype == torch.int64 and got.shape == (2, 9 + 64)
    assert torch.equal(got, want)
    m.reset()
    assert torch.equal(m.generate(ids, 64), want)           # reset: the same again
    other = torch.randint(0, 500, (2, 20))                   # prefill overwrites the cache
    assert torch.equal(m.generate(other, 30), _eager_tokens(llama_sample(), other, 30))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_transformers_decoders_match_generate_with_a_static_cache(tmp_path, family):
    m = _hf(family)
    ids = torch.randint(1, 500, (2, 7), generator=torch.Generator().manual_seed(2))
    want = _hf_reference(m, ids, 64)
    path = aotc.export(m, (ids,), tmp_path / "m.aotc", decode=True, max_cache_len=CACHE)
    assert m.config._attn_implementation != "aotc"          # the model is left as it was
    got = aotc.load(path).generate(ids, 64)
    assert torch.equal(got, want), (got[:, 7:], want[:, 7:])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "gemma", "mistral", "phi", "phi3"])
def test_more_transformers_decoders(tmp_path, family):
    test_transformers_decoders_match_generate_with_a_static_cache(tmp_path, family)


def test_positions_past_the_cache_are_guard_errors(sample):
    _, ids, path = sample
    m = aotc.load(path)
    with pytest.raises(GuardError, match="decode before prefill"):
        m.decode(ids[:, :1])
    with pytest.raises(GuardError, match="prompt"):
        m.prefill(torch.zeros(2, CACHE, dtype=torch.int64))   # a prompt must leave a slot
    with pytest.raises(GuardError, match="do not fit the cache"):
        m.generate(ids, CACHE)
    m.prefill(torch.zeros(2, CACHE - 2, dtype=torch.int64))
    m.decode(ids[:, :1])
    m.decode(ids[:, :1])
    with pytest.raises(GuardError, match="cache is full"):
        m.decode(ids[:, :1])
    with pytest.raises(GuardError, match="dim 0"):             # batch is fixed at export
        m.prefill(ids[:1])
    with pytest.raises(UsageError, match="generate"):
        m(ids)


def test_outputs_never_alias_the_state(sample):
    _, ids, path = sample
    m = aotc.load(path)
    first = m.prefill(ids)
    kept = first.clone()
    for _ in range(3):
        m.decode(first.argmax(-1, keepdim=True))
    assert torch.equal(first, kept)
    state = {id(t.untyped_storage()) for t in m.state.values()}
    assert id(first.untyped_storage()) not in state


def test_cache_writes_are_in_place(sample):
    """Decode writes one position of each cache (in the attention step that reads it), not a
    copy of the cache; prefill copies its new keys and values straight into the cache's slice
    (no functional copy of them first)."""
    _, _, path = sample
    m = aotc.load(path)
    ops = [s.op for s in m.entries["decode"].plan.steps if s.kind.value == "extern"]
    assert ops.count("aotc::decode_attention_write.default") == 2   # one per layer
    assert "aten::index_put_.default" not in ops and "aten::index_put.default" not in ops
    assert ops.count("aten::copy_.default") == 1              # the position
    pre = [s.op for s in m.entries["prefill"].plan.steps if s.kind.value == "extern"]
    assert "aten::slice_scatter.default" not in pre and pre.count("aten::copy_.default") == 5
    assert "aten::copy.default" not in pre


def test_manifest_describes_the_state_and_inspect_shows_it(sample):
    _, _, path = sample
    man = fmt.read_manifest(path)
    assert man.generation.max_cache_len == CACHE and man.generation.batch == 2
    names = {s.name: s for s in man.state}
    assert names["pos"].shape == (1,) and names["pos"].dtype == "int64"
    caches = [s for s in man.state if s.name.endswith(".k")]
    assert len(caches) == 2 and caches[0].shape == (2, 2, CACHE, 16)
    proc = run_aotc("inspect", path)
    assert "generator: prefill" in proc.stdout and "state: 5 tensors" in proc.stdout


def test_cli_generate_and_verify(sample):
    _, _, path = sample
    proc = run_aotc("generate", path, "--prompt-len", "8", "--new-tokens", "16", "--runs", "1")
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s" in proc.stdout and "prefill" in proc.stdout
    proc = run_aotc("verify", path)
    assert proc.returncode == 0 and "verified 16 greedy tokens" in proc.stdout, proc.stderr


def test_cli_export_decode(tmp_path):
    out = tmp_path / "s.aotc"
    proc = run_aotc("export", f"{SAMPLES_DIR / 'llama.py'}:Net", "-i", "1x8:int64:0..31999",
                    "--decode", "--max-cache-len", "32", "--init-args",
                    '{"layers": 1, "dim": 64, "heads": 2, "kv_heads": 1, "hidden": 64}',
                    "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert run_aotc("generate", out, "--prompt-len", "4", "--new-tokens", "4",
                    "--runs", "1").returncode == 0
    assert run_aotc("generate", out, "--prompt-len", "30", "--new-tokens", "4").returncode == 2


def test_state_slots_must_match_the_manifest(sample, tmp_path):
    _, _, path = sample
    art = copy_artifact(path, tmp_path / "a.aotc")
    edit_json(art, fmt.MANIFEST, lambda m: m["state"][1].update(shape=[2, 2, 8, 16]))
    with pytest.raises(ArtifactError, match="state"):
        aotc.load(art)


@pytest.mark.parametrize("runner", ["cpp", "python"])
def test_a_manifest_claiming_a_longer_cache_than_its_plans_is_a_guard_error(sample, tmp_path,
                                                                             runner):
    # a hostile or damaged manifest: positions past the plans' cache are refused by the op
    # (typed, before any write) instead of failing in ATen's index_copy_
    _, ids, path = sample
    art = copy_artifact(path, tmp_path / "a.aotc")
    edit_json(art, fmt.MANIFEST, lambda m: m["generation"].update(max_cache_len=4 * CACHE))
    m = aotc.load(art, runner=runner)
    m.prefill(torch.zeros(2, CACHE - 1, dtype=torch.int64))
    m.decode(ids[:, :1])
    with pytest.raises(GuardError, match="outside the KV cache") as e:
        m.decode(ids[:, :1])
    assert str(e.value.found) == str(CACHE)   # both runners (the C++ one says it in text)


def test_the_plans_compute_the_greedy_token_and_generate_feeds_it_back(sample, monkeypatch):
    # format 18: both entries' flat output 1 is the logits' argmax; a greedy generation takes
    # it from the plan and never takes an argmax of its own
    from aotc.runtime.sampling import Choice
    model, ids, path = sample
    m = aotc.load(path)
    assert m.manifest.generation.token == 1
    for outs in (m._prefill(ids), m._decode(ids[:, :1])):
        assert outs[1].dtype == torch.int64 and outs[1].shape == (2, 1)
        assert torch.equal(outs[1], outs[0].argmax(-1, keepdim=True))
    want = _eager_tokens(llama_sample(), ids, 8)

    def no_argmax(self, *args, **kwargs):
        raise AssertionError("a greedy generation took an argmax of the logits")
    monkeypatch.setattr(Choice, "__call__", no_argmax)
    assert torch.equal(m.generate(ids, 8), want)
    with pytest.raises(AssertionError, match="argmax of the logits"):   # a penalty reads them
        m.generate(ids, 8, repetition_penalty=1.2)


@pytest.mark.parametrize("token, found", [(0, "float32[2, 500]"), (2, "none of its 2 outputs"),
                                          (-1, "-1")])
def test_a_greedy_token_output_that_is_not_one_is_refused(sample, tmp_path, token, found):
    _, _, path = sample
    art = copy_artifact(path, tmp_path / "a.aotc")
    edit_json(art, fmt.MANIFEST, lambda m: m["generation"].update(token=token))
    with pytest.raises(ArtifactError, match="token") as e:
        aotc.load(art)
    assert found in str(e.value)


def test_a_format_17_manifest_has_no_greedy_token(sample, tmp_path):
    _, _, path = sample
    art = copy_artifact(path, tmp_path / "a.aotc")
    edit_json(art, fmt.MANIFEST, lambda m: m.update(format_version=17))
    with pytest.raises(ArtifactError, match="token"):
        aotc.load(art)
    edit_json(art, fmt.MANIFEST, lambda m: m["generation"].pop("token") and None)
    m = aotc.load(art)                      # as format 17 wrote them: the runtime's argmax
    assert m.manifest.generation.token is None
    _, ids, _ = sample
    assert torch.equal(m.generate(ids, 8), _eager_tokens(llama_sample(), ids, 8))


def test_a_model_without_the_convention_is_refused(tmp_path):
    with pytest.raises(UsageError, match="cannot be exported for decoding"):
        aotc.export(torch.nn.Linear(4, 4), (torch.zeros(1, 4, dtype=torch.int64),),
                    tmp_path / "x.aotc", decode=True)


def test_a_generator_swaps_weights_and_generates_with_them(sample, tmp_path):
    """A generator's state_dict is the model's (the caches are not in it); weights loaded into
    it, or swapped into a copy of the artifact, generate what the model with them generates."""
    model, ids, path = sample
    m = aotc.load(path)
    assert list(m.state_dict()) == list(llama_sample().state_dict())
    other = llama_sample()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.2)
    want = _eager_tokens(other, ids, 16)
    assert not torch.equal(want, _eager_tokens(llama_sample(), ids, 16))
    m.load_state_dict(other.state_dict())
    assert torch.equal(m.generate(ids, 16), want)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, tmp_path / "w.safetensors")
    r = run_aotc("swap-weights", path, tmp_path / "w.safetensors", "-o", tmp_path / "swapped.aotc")
    assert r.returncode == 0, r.stderr
    assert torch.equal(aotc.load(tmp_path / "swapped.aotc").generate(ids, 16), want)
    assert torch.equal(aotc.load(path, weights=tmp_path / "w.safetensors").generate(ids, 16),
                       want)
