"""Weight swap: state_dict() and load_state_dict() with torch's semantics on inference and
training artifacts, aotc.load(weights=), `aotc swap-weights`, and exports that leave the model
as they found it."""
from __future__ import annotations

import copy
import shutil

import pytest
import torch
from safetensors.torch import save_file, save_model

import aotc
from aotc.errors import StateDictError
from aotc.artifact import format as fmt
from conftest import LIBRARY, assert_matches, eager, read_raw_manifest, run_aotc


class Tied(torch.nn.Module):
    """Tied weights, a non-persistent buffer and an unused parameter."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        self.mix = torch.nn.Linear(32, 32)
        self.out = torch.nn.Linear(32, 50, bias=False)
        self.out.weight = self.emb.weight
        self.unused = torch.nn.Parameter(torch.zeros(3))
        self.register_buffer("pos", torch.arange(8), persistent=False)

    def forward(self, ids):
        h = self.emb(ids) + self.pos[:ids.shape[1], None].to(torch.float32)
        return self.out(torch.tanh(self.mix(h)))


def varied(state: dict, seed: int = 1) -> dict:
    """A state dict of the same shapes with other floating values (a 'fine-tuned' variant)."""
    g = torch.Generator().manual_seed(seed)
    return {k: (v + 0.1 * torch.randn(v.shape, generator=g).to(v.dtype)
                if v.is_floating_point() else v.clone()) for k, v in state.items()}


def bound_pointers(m) -> dict:
    """Data pointers of every tensor a plan holds (weights, views, layout copies)."""
    return {(e, n): v.data_ptr() for e, entry in m.entries.items()
            for n, v in entry.function.namespace.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("runner", ["python", None])
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_swap_then_call_equals_eager_with_the_new_weights(exported, name, runner):
    """Both plan runners: the C++ runner takes its folded views and laid-out weights again."""
    ex = exported(name)
    m = aotc.load(ex.path, runner=runner)
    assert list(m.state_dict()) == list(ex.model.state_dict())
    for k, v in ex.model.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k
    before = bound_pointers(m) if "cpp" not in m.runtime else {}
    new = varied(ex.model.state_dict())
    result = m.load_state_dict(new)
    assert result.missing_keys == [] and result.unexpected_keys == []
    ref = copy.deepcopy(ex.model)
    ref.load_state_dict(new)
    assert_matches(m(*ex.inputs), eager(ref, ex.inputs), rtol=1e-4, atol=1e-4)
    assert not before or bound_pointers(m) == before   # in place: plans and CUDA graphs keep their pointers
    for k, v in new.items():
        assert torch.equal(m.state_dict()[k], v.to(m.state_dict()[k].dtype)), k


def test_state_dict_leaves_out_non_persistent_buffers_and_keeps_tied_names(tmp_path):
    torch.manual_seed(0)
    model, ids = Tied().eval(), torch.randint(0, 50, (2, 8))
    m = aotc.load(aotc.export(model, (ids,), tmp_path / "t.aotc"))
    assert list(m.state_dict()) == list(model.state_dict())
    assert "pos" not in m.state_dict() and "out.weight" in m.state_dict()
    new = varied(model.state_dict())
    new["out.weight"] = new["emb.weight"]
    m.load_state_dict(new)
    model.load_state_dict(new)
    torch.testing.assert_close(m(ids), eager(model, (ids,)), rtol=1e-5, atol=1e-5)
    one = {k: v for k, v in new.items() if k != "out.weight"}    # tied: one name is enough
    m.load_state_dict(one)


def test_strict_errors_are_torchs_and_nothing_is_written(exported):
    ex = exported("mlp")
    m = aotc.load(ex.path)
    keep = {k: v.clone() for k, v in m.state_dict().items()}
    bad = varied(ex.model.state_dict())
    first = next(iter(bad))
    del bad[first]
    bad["extra.weight"] = torch.zeros(1)
    shaped = next(k for k, v in bad.items() if v.dim() == 2)
    bad[shaped] = bad[shaped].t().contiguous()
    with pytest.raises(StateDictError) as info:
        m.load_state_dict(bad)
    msg = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert msg.startswith("Error(s) in loading state_dict for CompiledModule:")
    assert f'Missing key(s) in state_dict: "{first}".' in msg
    assert 'Unexpected key(s) in state_dict: "extra.weight".' in msg
    assert f"size mismatch for {shaped}: copying a param with shape" in msg
    for k, v in m.state_dict().items():
        assert torch.equal(v, keep[k]), f"{k} was written although loading failed"
    bad[shaped] = bad[shaped].t().contiguous().to(torch.int64)
    with pytest.raises(StateDictError, match=f"dtype mismatch for {shaped}"):
        m.load_state_dict(bad, strict=False)
    bad[shaped] = "not a tensor"
    with pytest.raises(StateDictError, match="expected torch.Tensor"):
        m.load_state_dict(bad, strict=False)
    del bad[shaped]
    result = m.load_state_dict(bad, strict=False)
    assert result.missing_keys == [first, shaped] and result.unexpected_keys == ["extra.weight"]
    assert torch.equal(m.state_dict()[first], keep[first])


def test_floating_values_are_cast_as_torch_casts(tmp_path):
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8)), torch.randn(2, 8)
    m = aotc.load(aotc.export(model, (x,), tmp_path / "b.aotc", dtype="bf16"))
    new = varied(model.state_dict())            # float32, into a bfloat16 artifact
    m.load_state_dict(new)
    assert m.state_dict()["0.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(m.state_dict()["0.weight"], new["0.weight"].bfloat16())


def test_load_with_a_weights_file_and_the_swap_weights_command(exported, tmp_path):
    ex = exported("mlp")
    new = varied(ex.model.state_dict(), seed=3)
    ref = copy.deepcopy(ex.model)
    ref.load_state_dict(new)
    want = eager(ref, ex.inputs)
    save_file(new, tmp_path / "ft.safetensors")
    assert_matches(aotc.load(ex.path, weights=tmp_path / "ft.safetensors")(*ex.inputs), want,
                   rtol=1e-4, atol=1e-4)
    out = tmp_path / "ft.aotc"
    proc = run_aotc("swap-weights", ex.path, tmp_path / "ft.safetensors", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "left out samples/inputs.safetensors" in proc.stderr
    assert_matches(aotc.load(out)(*ex.inputs), want, rtol=1e-4, atol=1e-4)
    before, after = read_raw_manifest(ex.path), read_raw_manifest(out)
    for rel in (LIBRARY, fmt.plan_file("forward")):   # kernels and plans shared
        assert after["files"][rel] == before["files"][rel]
    assert fmt.SAMPLE_INPUTS not in after["files"]
    assert after["weights"]["transposed"] == before["weights"]["transposed"]
    new.pop(next(iter(new)))
    save_file(new, tmp_path / "short.safetensors")
    proc = run_aotc("swap-weights", ex.path, tmp_path / "short.safetensors", "-o", out)
    assert proc.returncode == 2 and "Missing key(s)" in proc.stderr
    assert_matches(aotc.load(out)(*ex.inputs), want, rtol=1e-4, atol=1e-4)   # left as it was


def test_a_safetensors_file_with_tied_weights_stored_once_loads(tmp_path):
    torch.manual_seed(0)
    model, ids = Tied().eval(), torch.randint(0, 50, (2, 8))
    path = aotc.export(model, (ids,), tmp_path / "t.aotc")
    variant = Tied()
    save_model(variant, tmp_path / "v.safetensors")     # drops one name of the tied pair
    m = aotc.load(path, weights=tmp_path / "v.safetensors")
    torch.testing.assert_close(m(ids), eager(variant.eval(), (ids,)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_swap_weights_through_the_triton_interpreter(tmp_path, train):
    pytest.importorskip("triton")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    x = torch.randn(4, 16)
    path = aotc.export(copy.deepcopy(model), (x,), tmp_path / "c.aotc", target="cuda:sm_90",
                       train=train)
    m = aotc.load(path, device="cpu", interpret=True)
    assert list(m.state_dict()) == list(model.state_dict())
    new = varied(model.state_dict())
    m.load_state_dict(new)
    model.load_state_dict(new)
    if train:
        torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-4)
    else:
        torch.testing.assert_close(m(x), eager(model, (x,)), rtol=1e-4, atol=1e-4)


def test_training_state_dict_round_trip_with_non_persistent_buffers(tmp_path):
    torch.manual_seed(0)
    model, ids = Tied(), torch.randint(0, 50, (2, 8))
    m = aotc.load(aotc.export(copy.deepcopy(model), (ids,), tmp_path / "t.aotc", train=True))
    assert list(m.state_dict()) == list(model.state_dict())
    result = m.load_state_dict(model.state_dict())            # strict: torch's own check
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert m.out.weight is m.emb.weight          # tied, as in the model
    new = varied(model.state_dict())
    m.load_state_dict(new)
    model.load_state_dict(new)
    torch.testing.assert_close(m(ids), model(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["albert", "t5"])
def test_training_artifacts_of_transformers_load_their_state_dict(tmp_path, arch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "albert":
        cfg = transformers.AlbertConfig(vocab_size=100, hidden_size=32, num_attention_heads=2,
                                        intermediate_size=64, num_hidden_layers=2,
                                        embedding_size=16)
        model = transformers.AlbertModel(cfg)
    else:
        cfg = transformers.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                    num_heads=2)
        model = transformers.T5EncoderModel(cfg)
    ids = torch.randint(0, 100, (2, 8))
    m = aotc.load(aotc.export(model, (ids,), tmp_path / "t.aotc", train=True))
    assert set(m.state_dict()) == set(model.state_dict())
    m.load_state_dict(model.state_dict())
    assert all(p.grad is None for p in model.parameters())


def test_export_leaves_the_model_as_it_found_it(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    model[0].weight.grad = torch.ones_like(model[0].weight)
    grad = model[0].weight.grad
    model.eval()
    model[1].train()
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    aotc.export(model, (x,), tmp_path / "t.aotc", train=True)
    aotc.export(model, (x,), tmp_path / "i.aotc")
    assert model[0].weight.grad is grad and torch.equal(grad, torch.ones_like(grad))
    assert all(p.grad is None for n, p in model.named_parameters() if n != "0.weight")
    assert [m.training for m in model.modules()] == [False, False, True, False, False]
    assert all(torch.equal(v, buffers[k]) for k, v in model.named_buffers())
    assert torch.equal(torch.get_rng_state(), rng)


def test_swapping_into_the_same_path_keeps_loaded_modules(exported, tmp_path):
    """Swapping into the same path replaces it atomically; the old module keeps its weights."""
    ex = exported("mlp")
    art = shutil.copytree(ex.path, tmp_path / "a.aotc")
    old = aotc.load(art)
    want = old(*ex.inputs)
    new = varied(ex.model.state_dict(), seed=5)
    save_file(new, tmp_path / "n.safetensors")
    proc = run_aotc("swap-weights", art, tmp_path / "n.safetensors", "-o", art)
    assert proc.returncode == 0, proc.stderr
    torch.testing.assert_close(old(*ex.inputs), want)
    ref = copy.deepcopy(ex.model)
    ref.load_state_dict(new)
    assert_matches(aotc.load(art)(*ex.inputs), eager(ref, ex.inputs), rtol=1e-4, atol=1e-4)


def test_a_weights_file_that_is_missing_or_not_safetensors_is_refused(exported, tmp_path):
    ex = exported("mlp")
    with pytest.raises(aotc.UsageError, match="cannot read weights file"):
        aotc.load(ex.path, weights=tmp_path / "none.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b"not json")
    with pytest.raises(aotc.ArtifactError, match="damaged header"):
        aotc.load(ex.path, weights=tmp_path / "bad.safetensors")
