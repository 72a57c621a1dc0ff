"""GPT-2 split over 2 gloo ranks (`--tensor-parallel 2`): the fused c_attn column-parallel with
each rank holding its heads' slices of q, k and v, c_proj and the MLP's c_proj row-parallel,
c_fc column-parallel, the tied wte/lm_head split by vocabulary, wpe and the layer norms
replicated. The vocabulary is odd (97, as GPT-2's 50257 is): padded to 98, 49 rows a rank, the
gathered logits cut back to 97. The forward equals the unsharded model's, and a generator's
greedy tokens equal transformers' own with a static cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import aotc
from aotc.errors import ExportError, TargetError
from test_tensor_parallel import CACHE, _port, generator_matches_generate, launch

tf = pytest.importorskip("transformers")


def _gpt2(vocab: int = 97, heads: int = 4, **config):
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2,
                                             n_head=heads, n_positions=CACHE, bos_token_id=0,
                                             eos_token_id=0, **config)).eval()
    with torch.no_grad():    # non-zero biases, so that a bias split or added twice shows
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.1)
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def forward(tmp_path_factory):
    model = _gpt2(use_cache=False)
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(3))
    path = aotc.export(model, (ids,), tmp_path_factory.mktemp("gpt2") / "gpt2-tp2.aotc",
                       tensor_parallel=2)
    return model, ids, path


def test_forward_equals_the_unsharded_model(forward, tmp_path):
    model, ids, path = forward
    with torch.no_grad():
        want = model(ids).logits
    m = json.loads((path / "manifest.json").read_text())
    sharding = m["tensor_parallel"]["sharding"]
    h0 = "transformer.h.0."
    assert sharding[h0 + "attn.c_attn.weight"] == 1 and sharding[h0 + "attn.c_attn.bias"] == 0
    assert sharding[h0 + "attn.c_proj.weight"] == 0 and h0 + "attn.c_proj.bias" not in sharding
    assert sharding[h0 + "mlp.c_fc.weight"] == 1 and sharding[h0 + "mlp.c_proj.weight"] == 0
    assert sharding["transformer.wte.weight"] == 0          # with the tied lm_head: one slice
    assert m["weights"]["aliases"] == {"lm_head.weight": "transformer.wte.weight"}
    assert not {"transformer.wpe.weight", h0 + "ln_1.weight"} & set(sharding)   # replicated
    from aotc.cli.report import inspect_text
    assert "all_gather x1, all_reduce x5" in inspect_text(path)   # 2 a layer, the embedding's
    for _, out in launch(2, path, tmp_path / "out"):
        torch.testing.assert_close(out["0"], want, rtol=1e-4, atol=1e-4)
    _check_fused_split(model, path)


def _check_fused_split(model, path):
    """Rank 1's c_attn is the second half of each of q, k and v, in that order."""
    stored = load_file(str(path / "weights-rank1.safetensors"))
    name = "transformer.h.1.attn.c_attn.bias"
    full = dict(model.named_parameters())[name].detach()
    q, k, v = full.split(64)
    assert torch.equal(stored[name], torch.cat([q[32:], k[32:], v[32:]]))


def test_generator_matches_generate(tmp_path):
    """The KV cache holds each rank's 2 of the 4 heads; the last rank's vocabulary rows are
    padded with one zero row."""
    model = _gpt2()
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(4))
    path = generator_matches_generate(model, ids, tmp_path)
    m = json.loads((path / "manifest.json").read_text())
    assert {tuple(s["shape"]) for s in m["state"] if s["name"] != "pos"} == {(1, 2, CACHE, 16)}
    assert m["tensor_parallel"]["sharding"]["transformer.wte.weight"] == 0
    last = load_file(str(path / "weights-rank1.safetensors"))["transformer.wte.weight"]
    full = model.transformer.wte.weight.detach()
    assert last.shape == (49, 64) and torch.equal(last[:48], full[49:]) and not last[48].any()


def test_heads_that_do_not_divide_are_refused(tmp_path):
    with pytest.raises(ExportError) as info:
        aotc.export(_gpt2(heads=2, use_cache=False), (torch.zeros(1, 4, dtype=torch.int64),),
                    tmp_path / "x.aotc", tensor_parallel=4)
    assert "heads (2) does not divide by the 4 ranks" in info.value.what
    assert info.value.where == "transformer.h.0.attn.c_attn"


def test_cross_attention_is_refused(tmp_path):
    model = _gpt2(add_cross_attention=True, use_cache=False)
    with pytest.raises(ExportError) as info:
        aotc.export(model, (torch.zeros(1, 4, dtype=torch.int64),), tmp_path / "x.aotc",
                    tensor_parallel=2)
    assert info.value.where == "transformer.h.0.crossattention.c_attn"
    assert "cross-attention" in info.value.fix


def test_cli_verify_runs_under_torchrun(forward):
    """`torchrun --nproc-per-node 2 -m aotc.cli.main verify`: the CLI makes the process group
    from torchrun's environment; each rank verifies its output, its lines prefixed."""
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-addr", "127.0.0.1", "--master-port", str(_port()),
                          "-m", "aotc.cli.main", "verify", str(forward[2])],
                         capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}/2] verified 1 outputs" in run.stdout


def test_cli_verify_without_a_launcher_says_how_to_launch(forward):
    from click.testing import CliRunner
    from aotc.cli.main import main
    result = CliRunner().invoke(main, ["verify", str(forward[2])])
    assert result.exit_code == TargetError.exit_code, result.output
    assert "torchrun --nproc-per-node 2 --no-python aotc verify" in result.output


def test_four_ranks_partial_sums_add_up():
    """4 ranks of 1 head each, in one process, where aotc::all_reduce is the identity: each
    rank's attention output is its heads' partial product plus the bias, so the ranks' outputs
    add up to the unsharded attention's, with the bias 3 more times."""
    from aotc.exporter.parallel import shard_model
    model = _gpt2(use_cache=False)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(5))
    attn = model.transformer.h[0].attn
    with torch.no_grad():
        want = attn(x)[0]
        parts = [shard_model(model, r, 4)[0].transformer.h[0].attn(x)[0] for r in range(4)]
    assert parts[0].shape == want.shape
    torch.testing.assert_close(sum(parts) - 3 * attn.c_proj.bias, want)
