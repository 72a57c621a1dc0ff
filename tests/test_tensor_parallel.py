"""Tensor-parallel artifacts (`--tensor-parallel N`) run on 2 CPU processes with gloo: each
rank's output equals the unsharded model's (forward of samples/llama.py and of a transformers
LLaMA with tied embeddings, split by vocabulary; greedy tokens of the sample and of a
transformers Qwen2 as generators equal their eager tokens; GPT-2 is in
test_tensor_parallel_gpt2.py), and loading refuses a world size other than the artifact's, or
no process group, with a TargetError."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import aotc
from aotc.errors import ExportError, TargetError
from aotc.artifact import format as fmt
from conftest import llama_sample

WORKER = Path(__file__).with_name("tp_worker.py")
CACHE = 64


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, artifact, out: Path, *args: str) -> list[tuple[dict, dict]]:
    """Run tests/tp_worker.py as `world` ranks: each rank's (facts, tensors)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(artifact), str(out), *args],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = [p.communicate(timeout=180)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [(json.loads((out / f"rank{r}.json").read_text()),
             load_file(str(out / f"rank{r}.safetensors"))) for r in range(world)]


@pytest.fixture(scope="module")
def forward(tmp_path_factory):
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(1))
    path = aotc.export(llama_sample(), (ids,), tmp_path_factory.mktemp("tp") / "llama-tp2.aotc",
                       tensor_parallel=2)
    return ids, path


def test_forward_equals_the_unsharded_model(forward, tmp_path):
    ids, path = forward
    with torch.no_grad():
        want = llama_sample()(ids)
    ranks = launch(2, path, tmp_path)
    for facts, out in ranks:
        torch.testing.assert_close(out["0"], want, rtol=1e-4, atol=1e-4)
        assert "collectives" in facts["runtime"]    # the C++ runner declines, and says why
    assert torch.equal(ranks[0][1]["0"], ranks[1][1]["0"])


def test_the_artifact_records_its_ranks_and_sharding(forward):
    ids, path = forward
    m = json.loads((path / "manifest.json").read_text())
    tp = m["tensor_parallel"]
    assert m["format_version"] == fmt.FORMAT_VERSION and tp["world_size"] == 2
    assert [r["shards"] for r in tp["ranks"]] == [["weights-rank0.safetensors"],
                                                  ["weights-rank1.safetensors"]]
    assert tp["sharding"]["layers.0.attn.wq.weight"] == 0
    assert tp["sharding"]["layers.0.attn.wo.weight"] == 1
    assert tp["sharding"]["layers.1.w2.weight"] == 1
    assert tp["sharding"]["output.weight"] == 0             # the LM head, by vocabulary
    assert tp["sharding"]["embed.weight"] == 0              # the embedding too
    assert "layers.0.attn_norm.weight" not in tp["sharding"]   # replicated
    from aotc.cli.report import inspect_text
    text = inspect_text(path)
    assert "world size 2" in text and "all_gather x1, all_reduce x5" in text
    assert "split along dim 1 of the model's tensor: 4" in text


def test_loading_without_a_process_group_is_refused(forward):
    with pytest.raises(TargetError) as info:
        aotc.load(forward[1])
    assert info.value.expected == "a process group of world size 2"
    assert "init_process_group" in info.value.fix


def test_a_wrong_world_size_is_refused(forward, tmp_path):
    [(facts, _)] = launch(1, forward[1], tmp_path)
    assert facts["error"] == "TargetError", facts
    assert (facts["expected"], facts["found"]) == ("2", "1")
    assert "--nproc-per-node 2" in facts["fix"]


def test_generator_tokens_equal_eager_tokens(tmp_path):
    from aotc.exporter.generate import Generator, adapt, eager_generate
    ids = torch.randint(0, 500, (1, 7), generator=torch.Generator().manual_seed(2))
    path = aotc.export(llama_sample(), (ids,), tmp_path / "gen-tp2.aotc", decode=True,
                       max_cache_len=CACHE, tensor_parallel=2)
    want = eager_generate(Generator(adapt(llama_sample(), 1, CACHE), CACHE), ids, 16)
    for facts, out in launch(2, path, tmp_path / "out", "--new-tokens", "16"):
        assert torch.equal(out["tokens"], want), facts


def test_sampling_ranks_draw_the_same_tokens(tmp_path):
    """Sampled generation on a split artifact: each rank seeded differently, every rank takes
    rank 0's draw (they would otherwise diverge, and their collectives mix two sequences)."""
    ids = torch.randint(0, 500, (1, 7), generator=torch.Generator().manual_seed(2))
    path = aotc.export(llama_sample(), (ids,), tmp_path / "gen-tp2.aotc", decode=True,
                       max_cache_len=CACHE, tensor_parallel=2)
    (_, a), (_, b) = launch(2, path, tmp_path / "out", "--new-tokens", "24", "--sample")
    assert torch.equal(a["tokens"], b["tokens"])
    assert a["tokens"].shape == (1, 7 + 24)


def test_transformers_llama_forward(tmp_path):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        use_cache=False, tie_word_embeddings=True)).eval()    # head and embedding: one slice
    ids = torch.randint(0, 500, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits
    path = aotc.export(model, (ids,), tmp_path / "hf-tp2.aotc", tensor_parallel=2)
    weights = json.loads((path / "manifest.json").read_text())["weights"]
    assert weights["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}   # still tied
    for _, out in launch(2, path, tmp_path / "out"):
        torch.testing.assert_close(out["0"], want, rtol=1e-4, atol=1e-4)


def test_heads_that_do_not_divide_are_refused(tmp_path):
    ids = torch.zeros(1, 4, dtype=torch.int64)
    with pytest.raises(ExportError) as info:
        aotc.export(llama_sample(), (ids,), tmp_path / "x.aotc", tensor_parallel=4)
    assert "KV heads (2) does not divide by the 4 ranks" in info.value.what
    assert info.value.where == "layers.0.attn.wk"


def test_a_projection_no_rule_splits_is_refused(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with pytest.raises(ExportError) as info:
        aotc.export(model, (torch.randn(2, 8),), tmp_path / "x.aotc", tensor_parallel=2)
    assert info.value.where == "0" and "no tensor-parallel rule" in info.value.what


def test_transformers_qwen2_generator_matches_generate(tmp_path):
    """Qwen2 (biases on q/k/v, split with them) as a generator: transformers' own greedy
    tokens with a static cache."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tf.Qwen2ForCausalLM(tf.Qwen2Config(
        vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)).eval()
    model.generation_config.eos_token_id = None
    ids = torch.randint(0, 500, (1, 8), generator=torch.Generator().manual_seed(3))
    generator_matches_generate(model, ids, tmp_path)


def generator_matches_generate(model, ids, tmp_path: Path) -> Path:
    """Export `model` as a TP=2 generator; both ranks' 16 greedy tokens equal transformers'
    own with a static cache. The artifact's path."""
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                              do_sample=False, cache_implementation="static", pad_token_id=0)
    path = aotc.export(model, (ids,), tmp_path / "gen-tp2.aotc", decode=True,
                       max_cache_len=CACHE, tensor_parallel=2)
    for _, out in launch(2, path, tmp_path / "out", "--new-tokens", "16"):
        assert torch.equal(out["tokens"], want)
    return path


FIXTURE = Path(__file__).parent / "fixtures" / "format_v8_tp.aotc"


@pytest.mark.parametrize("edit, field", [
    (lambda tp: tp.update(world_size=3), "ranks"),                         # too few ranks
    (lambda tp: tp["ranks"][1].update(shards=["../weights-rank1.safetensors"]), "shards"),
    (lambda tp: tp["ranks"][1].update(shards=tp["ranks"][0]["shards"]), "shards"),  # rank 0's
    (lambda tp: tp["ranks"][1]["map"].pop("w2.weight"), "ranks"),          # a tensor missing
    (lambda tp: tp["sharding"].update({"nope": 0}), "sharding"),
    (lambda tp: tp["sharding"].update({"w2.weight": "1"}), "sharding"),
])
def test_a_damaged_tensor_parallel_section_is_refused(tmp_path, edit, field):
    from aotc.errors import ArtifactError
    from hostile import copy_artifact, edit_json
    path = copy_artifact(FIXTURE, tmp_path / "tp.aotc")
    edit_json(path, "manifest.json", lambda m: (edit(m["tensor_parallel"]), m)[1])
    with pytest.raises(ArtifactError) as info:
        aotc.load(path)
    assert "tensor_parallel" in info.value.where and field in info.value.where


def test_swapping_the_weights_of_a_split_artifact_is_refused(tmp_path):
    from aotc.errors import UsageError
    from aotc.runtime.swap import swap_weights
    with pytest.raises(UsageError) as info:
        swap_weights(FIXTURE, tmp_path / "w.safetensors", tmp_path / "out.aotc")
    assert "--tensor-parallel 2" in info.value.fix


def test_collectives_outside_a_tensor_parallel_artifact_are_refused(tmp_path):
    from aotc.errors import ArtifactError
    from hostile import copy_artifact, edit_json
    path = copy_artifact(FIXTURE, tmp_path / "tp.aotc")
    edit_json(path, "manifest.json", lambda m: m.pop("tensor_parallel") and m)
    with pytest.raises(ArtifactError) as info:
        aotc.load(path)
    assert "collectives only in a tensor-parallel artifact" in str(info.value.expected)
