"""Training artifacts: compiled forward + precomputed backward, wired into autograd."""
import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import aotc

sys.path.insert(0, str(Path(__file__).parents[1] / "samples"))
import cnn, hf_models, mlp, transformer  # noqa: E402


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return list(out.values()) if isinstance(out, dict) else list(out)


def projection_loss(out, seed=123):
    """A loss whose gradient reaches every output element with non-trivial weights."""
    g = torch.Generator().manual_seed(seed)
    return sum((o * torch.randn(o.shape, generator=g)).sum() for o in flat(out)
               if o.is_floating_point())


class SdpaBlock(nn.Module):
    """Attention through F.scaled_dot_product_attention (as timm's ViTs and transformers' sdpa
    models call it), causal and not: its backward must be the op's, not a kernel's guess."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v)
        c = nn.functional.scaled_dot_product_attention(q, k, a, is_causal=True)
        return self.proj(c.transpose(1, 2).reshape(b, t, d))


def models():
    torch.manual_seed(0)
    yield "sdpa", SdpaBlock(), (torch.randn(2, 8, 32),)
    yield "mlp", mlp.Net(), (torch.randn(16, 64),)
    yield "cnn", cnn.Net(), (torch.randn(4, 3, 16, 16),)
    yield "transformer", transformer.Net(layers=1), (torch.randn(2, 16, 128),)
    if pytest.importorskip("transformers"):
        yield "gpt2", hf_models.gpt2(), (torch.randint(0, 1000, (2, 16)),)
        yield "bert", hf_models.bert(), (torch.randint(0, 1000, (2, 16)),)


CASES = {name: (model, args) for name, model, args in models()}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = {}
    for name, (model, args) in CASES.items():
        ref = copy.deepcopy(model)
        out[name] = (aotc.export(model, args, tmp_path_factory.mktemp(name) / "t.aotc",
                                 train=True), ref, args)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_eager(exported, name):
    path, model, args = exported[name]
    ref = copy.deepcopy(model).train()
    m = aotc.load(path)
    assert isinstance(m, nn.Module)
    torch.manual_seed(7)
    projection_loss(m(*args)).backward()
    torch.manual_seed(7)
    projection_loss(ref(*args)).backward()
    names = [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in m.named_parameters()] == names
    for (n, a), (_, b) in zip(m.named_parameters(), ref.named_parameters()):
        assert a.grad is not None, n
        # sums (embedding backward's scatter-add) run in another order: a few ulps of slack
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=5e-5,
                                   msg=lambda s: f"{n}: {s}")


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_input_gradients_match_eager(exported, name):
    path, model, args = exported[name]
    ref = copy.deepcopy(model).train()
    m = aotc.load(path)
    xa = args[0].clone().requires_grad_()
    xb = args[0].clone().requires_grad_()
    torch.manual_seed(3)
    projection_loss(m(xa)).backward()
    torch.manual_seed(3)
    projection_loss(ref(xb)).backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)


# AdamW divides by the gradient's own magnitude, so a gradient that is zero in theory (the key
# projection's bias under softmax, in attention models) turns rounding noise into full steps
# in eager and compiled alike; AdamW is compared on models without such components.
@pytest.mark.parametrize("name,opt_name", [("mlp", "SGD"), ("transformer", "SGD"), ("gpt2", "SGD"),
                                           ("mlp", "AdamW"), ("cnn", "AdamW")])
def test_optimizer_steps_track_eager(exported, name, opt_name):
    path, model, args = exported[name]
    ref = copy.deepcopy(model).train()
    m = aotc.load(path)
    make = lambda ps: getattr(torch.optim, opt_name)(ps, lr=1e-3)
    oa, ob = make(m.parameters()), make(ref.parameters())
    for step in range(4):
        for mod, opt in ((m, oa), (ref, ob)):
            torch.manual_seed(step)       # same dropout masks in both
            opt.zero_grad()
            projection_loss(mod(*args), seed=step).backward()
            opt.step()
    for (n, a), (_, b) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda s: f"{n}: {s}")


def test_batchnorm_running_statistics_update_as_in_eager(exported):
    path, model, args = exported["cnn"]
    ref = copy.deepcopy(model).train()
    m = aotc.load(path)
    for _ in range(3):
        m(*args)
        ref(*args)
    for (n, a), (_, b) in zip(m.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda s: f"{n}: {s}")
    assert int(m.state_dict()["features.1.num_batches_tracked"]) == 3


def test_buffers_updated_to_the_same_value_are_still_updates(tmp_path):
    """Running statistics at a fixed point (momentum 0 here; converged bf16 statistics on a
    GPU) change neither value nor version in eager: the export still sees them updated, as the
    captured graph writes them, and the artifact tracks eager's buffers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, momentum=0.0)).train()
    x = torch.randn(16, 8)
    model(x)   # a step before export, as after some training
    ref = copy.deepcopy(model)
    m = aotc.load(aotc.export(model, (x,), tmp_path / "bn.aotc", train=True))
    for _ in range(2):
        projection_loss(m(x)).backward()
        projection_loss(ref(x)).backward()
    for (n, a), (_, b) in zip(m.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(a, b, msg=lambda s: f"{n}: {s}")
    assert int(m.state_dict()["1.num_batches_tracked"]) == 3


def test_dropout_is_reproducible_with_a_seed(tmp_path):
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(32, 32)
            self.d = nn.Dropout(0.5)

        def forward(self, x):
            return self.d(self.l(x))
    x = torch.randn(8, 32)
    m = aotc.load(aotc.export(Drop(), (x,), tmp_path / "d.aotc", train=True))
    torch.manual_seed(5)
    a = m(x)
    torch.manual_seed(5)
    b = m(x)
    torch.manual_seed(6)
    c = m(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert (a == 0).float().mean().item() == pytest.approx(0.5, abs=0.15)


def test_state_dict_round_trip_and_guards(exported):
    path, model, args = exported["mlp"]
    m = aotc.load(path)
    sd = {k: v.clone() * 0.5 for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    ref = copy.deepcopy(model)
    ref.load_state_dict(sd)
    torch.testing.assert_close(m(*args), ref(*args), rtol=1e-5, atol=1e-6)
    with pytest.raises(aotc.GuardError, match="dim 1"):
        m(torch.randn(16, 65))


@pytest.mark.parametrize("name", ["mlp", "gpt2"])
def test_random_inputs_fit_the_forward_and_run_backward(exported, name):
    # as a compiled module's: what `aotc run` and scripts/fuzz_artifact.py call a model with
    path, _, args = exported[name]
    m = aotc.load(path)
    x = m.random_inputs(seed=3)
    assert [(t.shape, t.dtype) for t in x] == [(a.shape, a.dtype) for a in args]
    if not x[0].is_floating_point():   # token ids stay in the range export recorded
        assert 0 <= int(x[0].min()) and int(x[0].max()) < 1000
    projection_loss(m(*x)).backward()
    assert all(p.grad is not None for p in m.parameters())


def test_backward_frees_saved_tensors_after_their_last_use(exported):
    """The backward plan drops each saved tensor after its last use once the caller hands its
    references over (a list the plan empties; autograd's own are cleared before)."""
    path, model, args = exported["transformer"]
    m = aotc.load(path)
    fn, plan = m.entries["backward"].function, m.entries["backward"].plan
    early = [s for step in plan.steps if step.kind.value == "free" for s in step.slots
             if s in plan.inputs]
    assert len(early) > len(plan.inputs) // 2
    dels = " ".join(ln for ln in fn.source.splitlines() if ln.strip().startswith("del "))
    assert all(f"v{s}" in dels.replace(",", " ").split() for s in early)
    torch.manual_seed(0)
    out = flat(m(*args))[0]
    saved = list(out.grad_fn.saved_tensors)
    tangents = [torch.ones(i.shape, dtype=getattr(torch, i.dtype))
                for i in m.entries["backward"].spec.inputs[len(saved):]]
    inputs = saved + tangents
    res = fn(inputs, {})
    assert inputs == [] and len(res) == len(m.entries["backward"].spec.outputs)


def test_inspect_shows_both_graphs_and_saved_tensors(exported):
    from aotc.cli.report import inspect_text
    from aotc.artifact import format as fmt
    path, _, _ = exported["mlp"]
    text = inspect_text(path)
    assert "\nforward(" in text and "\nbackward(" in text
    assert "saved for backward:" in text


def test_cli_export_train(tmp_path):
    import subprocess
    out = tmp_path / "cli.aotc"
    r = subprocess.run([sys.executable, "-m", "aotc.cli.main", "export",
                        str(Path(__file__).parents[1] / "samples" / "mlp.py") + ":Net",
                        "-i", "8x64", "--train", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = aotc.load(out)
    m(torch.randn(8, 64)).sum().backward()
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_backward_skips_input_gradients_nobody_wants(exported, name):
    """Inputs that need no gradient (the usual case) run the backward plan without the inputs'
    gradients: the MLP drops a matmul, the ConvNet's first convolution_backward computes no
    input gradient (output_mask). The parameters' gradients are bitwise those of the full
    backward, which still runs when an input requires grad."""
    from aotc.artifact.encoding import without_outputs
    path, _, args = exported[name]
    m = aotc.load(path)
    assert m.params_only is not None
    plan = m.entries["backward"].plan
    state = len(m.param_list) + len(m.buffer_names)
    pruned = without_outputs(plan, {i for i in range(state, len(plan.outputs))})
    ops = lambda p: [s.op for s in p.steps if s.kind.value == "extern"]  # noqa: E731
    if name == "mlp":
        assert ops(pruned).count("aten::mm.default") == ops(plan).count("aten::mm.default") - 1
    else:
        first = [s for s in pruned.steps
                 if getattr(s, "op", None) == "aten::convolution_backward.default"]
        assert any(s.args[10][0] is False and s.out[0] is None for s in first)
    calls = []
    m.params_only.fn = (lambda fn: lambda *a: calls.append(1) or fn(*a))(m.params_only.fn)

    def grads(x):
        for p in m.parameters():
            p.grad = None
        torch.manual_seed(5)
        projection_loss(m(x)).backward()
        return [p.grad.clone() for p in m.parameters()]
    without = grads(args[0])
    assert calls == [1]
    x = args[0].clone().requires_grad_()
    full = grads(x)
    assert calls == [1] and x.grad is not None
    for a, b in zip(without, full, strict=True):
        assert torch.equal(a, b)
