"""Export proves its artifact (aotc/prove.py): the written directory is loaded and run on the
recorded samples before it replaces the destination. A plan that fails is a LoweringError
naming the step, its op and the model's line, and nothing is left at the destination; an
artifact that ran says so in its manifest, one that could not (a CUDA target here) says why."""
import json

import pytest
import torch

import aotc
from aotc.codegen import extern_layout
from aotc.errors import LoweringError
from test_extern_layout import PoolFlatten


def _model_and_input():
    torch.manual_seed(0)
    return PoolFlatten().eval(), torch.randn(2, 3, 12, 12)


def test_manifest_records_the_proof(tmp_path):
    model, x = _model_and_input()
    path = aotc.export(model, (x,), tmp_path / "m.aotc")
    manifest = json.loads((path / "manifest.json").read_text())
    check, levels = manifest["export_check"], list(manifest["target"]["native"]["libraries"])
    assert check == {"ran": True, "samples": 1, "outputs": 1, "levels": levels}   # each proven
    skipped = aotc.export(model, (x,), tmp_path / "n.aotc", prove=False)
    assert json.loads((skipped / "manifest.json").read_text())["export_check"]["ran"] is False


def test_a_failing_step_is_a_lowering_error_and_leaves_nothing(tmp_path, monkeypatch):
    # without its layout pass, the flatten after the extern pool is a `view` of a
    # channels-last tensor, which fails at run time: export must catch that itself
    unplanned = lambda lowering, view, name, args, kwargs, out: (name, args, kwargs)  # noqa: E731
    monkeypatch.setattr(extern_layout, "lay_out_extern", unplanned)
    monkeypatch.setattr("aotc.codegen.graph.lay_out_extern", unplanned)
    model, x = _model_and_input()
    dest = tmp_path / "m.aotc"
    events = []
    with pytest.raises(aotc.LoweringError) as info:
        aotc.export(model, (x,), dest, progress=events.append)
    err = info.value
    assert "fails on the recorded sample inputs" in err.what
    assert "view" in err.where and "step" in err.where
    assert "test_extern_layout.py:" in err.where and "flatten" in err.where   # the model line
    assert "view" in str(err.found)
    assert not dest.exists() and not list(tmp_path.iterdir())   # no artifact, no temp dir
    assert any(e.startswith("proving the artifact") for e in events)


def test_wrong_outputs_are_a_lowering_error(tmp_path, monkeypatch):
    from aotc import prove
    model, x = _model_and_input()
    real = prove.prove
    monkeypatch.setattr(prove, "prove", lambda path, inputs, expected, isa=None, ref=None:
                        real(path, inputs, [e + 1 for e in expected], isa,
                             {i: r + 1 for i, r in (ref or {}).items()}))
    with pytest.raises(aotc.LoweringError, match=r"output #0 differs"):
        aotc.export(model, (x,), tmp_path / "m.aotc")
    assert not (tmp_path / "m.aotc").exists()


def test_a_cross_compiled_target_records_it_was_not_run():
    from aotc.prove import artifact_check
    check, record = artifact_check(((torch.ones(1),), (torch.ones(1),)), "cuda")
    assert check is None and record["ran"] is False and "aotc verify" in record["why"]


def test_half_precision_outputs_pass_on_relative_error_and_real_errors_do_not():
    """bf16 outputs of deep models differ from eager's elementwise by more than any fixed
    tolerance while being as accurate (relative L2 a few percent); a wrong row does not pass."""
    from aotc.prove import compare
    g = torch.Generator().manual_seed(0)
    want = (torch.randn(4, 1000, generator=g) * 3).bfloat16()
    noisy = (want.double() * (1 + 0.02 * torch.randn(4, 1000, generator=g))).bfloat16()
    assert not torch.allclose(noisy.double(), want.double(), rtol=2e-2, atol=2e-2)
    assert compare(noisy, want)[0]
    assert not compare(noisy, want, rtol=2e-2, atol=2e-2)[0]   # explicit tolerances: elementwise
    wrong = want.clone()
    wrong[1] = 0
    assert not compare(wrong, want)[0]
    assert not compare(noisy.float(), want.float())[0]         # fp32 stays elementwise
    nan = noisy.clone()
    nan[0, 0] = float("nan")
    assert not compare(nan, want)[0]


class _FakeGenerator:
    """What _prove_generation reads of a loaded generator: weights and generate()."""

    def __init__(self, weights, tokens):
        self.weights, self.tokens = weights, tokens

    def generate(self, prompt, n):
        return self.tokens[:, :prompt.shape[1] + n]


@pytest.mark.parametrize("first_weight", [torch.float32, torch.bfloat16])
def test_half_generators_may_flip_late_tokens_whatever_weight_comes_first(first_weight):
    """A bf16 generator whose first weight is a float32 buffer (rotary tables) is still proven
    as half precision: a later greedy token may flip, the prefill's may not."""
    from aotc.prove import _prove_generation
    weights = {"cos": torch.zeros(2, dtype=first_weight), "w": torch.zeros(2, dtype=torch.bfloat16)}
    prompt = torch.tensor([[1, 2, 3]])
    want = torch.tensor([[1, 2, 3, 7, 8, 9]])
    _prove_generation(_FakeGenerator(weights, torch.tensor([[1, 2, 3, 7, 5, 5]])), prompt, want)
    with pytest.raises(LoweringError, match="greedy tokens differ"):
        _prove_generation(_FakeGenerator(weights, torch.tensor([[1, 2, 3, 6, 8, 9]])), prompt,
                          want)
    fp32 = {"w": torch.zeros(2)}
    with pytest.raises(LoweringError, match="greedy tokens differ"):
        _prove_generation(_FakeGenerator(fp32, torch.tensor([[1, 2, 3, 7, 5, 5]])), prompt, want)


def test_rounding_is_told_from_a_wrong_result_by_the_float64_run():
    # a deep float32 model's eager output is itself ~1e-4 off the exact one: an artifact as
    # close to the float64 run as eager passes; one further off, or wrong, does not
    from aotc.prove import matches
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 768, generator=g, dtype=torch.float64) * 3
    eager = (ref + torch.randn(2, 768, generator=g, dtype=torch.float64) * 4e-5).float()
    close = (ref + torch.randn(2, 768, generator=g, dtype=torch.float64) * 5e-5).float()
    ok, text = matches(close, eager, None)
    assert not ok and "max abs diff" in text          # the fixed tolerance refuses it
    ok, text = matches(close, eager, ref)
    assert ok and "rmse against float64" in text, text
    far = (ref + torch.randn(2, 768, generator=g, dtype=torch.float64) * 2e-4).float()
    assert not matches(far, eager, ref)[0]
    wrong = close.clone()
    wrong[1, 7] += 0.05                                   # one element wrong
    assert not matches(wrong, eager, ref)[0]
    assert not matches(close, eager, ref, rtol=1e-4, atol=1e-4)[0]   # tolerances given: theirs


def test_export_records_the_float64_run_and_verify_uses_it(tmp_path):
    from aotc.cli.report import verify_artifact
    from aotc.errors import ArtifactError, VerifyError
    from hostile import copy_artifact, rehash
    from safetensors.torch import load_file, save_file
    model, x = _model_and_input()
    path = aotc.export(model, (x,), tmp_path / "m.aotc")
    ref = load_file(path / "samples" / "reference.safetensors")
    want = model.double()(x.double())
    assert list(ref) == ["0"] and ref["0"].dtype == torch.float64
    torch.testing.assert_close(ref["0"], want, rtol=0, atol=1e-12)
    model.float()
    # recorded outputs rounded as a deep model's eager ones are (2e-4 off the exact run):
    # the fixed tolerance refuses the artifact, the float64 run tells it is closer than eager
    noisy = copy_artifact(path, tmp_path / "noisy.aotc")
    g = torch.Generator().manual_seed(1)
    save_file({"0": (want + torch.randn(want.shape, generator=g, dtype=torch.float64) * 2e-4)
               .float().contiguous()}, noisy / "samples" / "outputs.safetensors")
    rehash(noisy)
    assert "rmse against float64" in verify_artifact(aotc.load(noisy))
    save_file({"0": torch.zeros(3, dtype=torch.float64)}, noisy / "samples" / "reference.safetensors")
    rehash(noisy)
    with pytest.raises(ArtifactError, match="reference of output #0"):
        verify_artifact(aotc.load(noisy))
    manifest = json.loads((noisy / "manifest.json").read_text())
    del manifest["files"]["samples/reference.safetensors"]
    (noisy / "manifest.json").write_text(json.dumps(manifest))
    rehash(noisy)
    with pytest.raises(VerifyError, match="output #0 differs"):
        verify_artifact(aotc.load(noisy))


def test_no_float64_run_where_outputs_are_not_floats_or_proof_is_off(tmp_path):
    model, x = _model_and_input()
    idx = aotc.export(lambda_module(lambda t: t.argmax(-1)), (x,), tmp_path / "i.aotc")
    assert not (idx / "samples" / "reference.safetensors").exists()
    off = aotc.export(model, (x,), tmp_path / "n.aotc", prove=False)
    assert not (off / "samples" / "reference.safetensors").exists()


def lambda_module(fn):
    class Fn(torch.nn.Module):
        def forward(self, t):
            return fn(t)
    return Fn()


def test_large_outputs_have_a_floor_relative_to_their_size():
    # a deep ResNet's logits of 2.5e4: eager 0.014 off float64, aotc's channels-last
    # convolutions 0.028 (2x eager's, 1.1e-6 of the values) is rounding; 4e-6 of them is not
    from aotc.prove import matches
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 1000, generator=g, dtype=torch.float64) * 2.5e4
    noise = lambda s: torch.randn(2, 1000, generator=g, dtype=torch.float64) * s  # noqa: E731
    eager = (ref + noise(0.014)).float()
    assert matches((ref + noise(0.03)).float(), eager, ref)[0]
    assert not matches((ref + noise(0.1)).float(), eager, ref)[0]
