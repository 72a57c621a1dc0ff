"""Dynamic shapes: one artifact serves every size in the declared ranges, checked against eager."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.export import Dim

import aotc
from aotc.api import export_file
from aotc.exporter.specs import parse_input_specs

SAMPLES = Path(__file__).parents[1] / "samples"
sys.path.insert(0, str(SAMPLES))


def build(module, name):
    import importlib
    torch.manual_seed(0)
    return getattr(importlib.import_module(module), name)().eval()


CASES = {   # name: (file ref, specs, eager factory, make(batch, seq) -> inputs)
    "mlp": ("mlp.py:Net", ["batch=8[1..64]x64"], ("mlp", "Net"),
            lambda b, s: (torch.randn(b, 64),)),
    "cnn": ("cnn.py:Net", ["batch=4[1..16]x3x32x32"], ("cnn", "Net"),
            lambda b, s: (torch.randn(b, 3, 32, 32),)),
    "transformer": ("transformer.py:Net", ["batch=2[1..8]xseq=16[2..128]x128"],
                    ("transformer", "Net"), lambda b, s: (torch.randn(b, s, 128),)),
}
HF = {
    "gpt2": ("hf_models.py:gpt2", ["batch=2[1..8]xseq=16[2..128]:int64:0..999"],
             ("hf_models", "gpt2"), lambda b, s: (torch.randint(0, 1000, (b, s)),)),
    "bert": ("hf_models.py:bert", ["batch=2[1..8]xseq=16[2..128]:int64:0..999"],
             ("hf_models", "bert"), lambda b, s: (torch.randint(0, 1000, (b, s)),)),
}
SIZES = [(1, 2), (2, 16), (3, 7), (8, 128), (5, 97), (4, 64), (7, 31)]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = {}
    for name, (ref, specs, _, _) in {**CASES, **HF}.items():
        if name in HF:
            pytest.importorskip("transformers")
        out[name] = export_file(str(SAMPLES / ref), parse_input_specs(specs),
                                tmp_path_factory.mktemp(name) / f"{name}.aotc")
    return out


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return list(out.values())
    return [v for v in out if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("name", list(CASES) + list(HF))
def test_every_size_in_range_matches_eager(artifacts, name):
    ref, specs, (mod, fn), make = {**CASES, **HF}[name]
    model = build(mod, fn)
    m = aotc.load(artifacts[name])
    ranges = m.entries["forward"].spec.symbols
    for b, s in SIZES:
        b = min(max(b, ranges["batch"].min), ranges["batch"].max)
        if "seq" in ranges:
            s = min(max(s, ranges["seq"].min), ranges["seq"].max)
        inputs = make(b, s)
        with torch.no_grad():
            want = flat(model(*inputs))
        got = flat(m(*inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, causal", [("gpt2", True), ("bert", False)])
def test_attention_masks_are_proved_for_every_size(artifacts, name, causal):
    """With batch and seq dynamic, transformers' masks are proved as in a static export: every
    SDPA call runs maskless (is_causal for GPT-2), and GPT-2's packed-sequence ids (slices of
    the position ids along seq, their cumsum) leave no ATen step behind. The outputs at every
    size are checked against eager above. No kernel builds the mask or the ids any more: every
    kernel writes float32 activations."""
    plan = json.loads((artifacts[name] / "plans/forward.json").read_text())
    externs = [s for s in plan["steps"] if s["kind"] == "extern"]
    sdpa = [s for s in externs if "scaled_dot_product" in s["op"]]
    is_causal = lambda s: s["args"][5] if len(s["args"]) > 5 else s["kwargs"].get(  # noqa: E731
        "is_causal", False)
    assert len(sdpa) == 2 and all(s["args"][3] is None and is_causal(s) == causal
                                  for s in sdpa)
    assert "aten::cumsum.default" not in {s["op"] for s in externs}
    written = {plan["slots"][o]["dtype"] for s in plan["steps"] if s["kind"] == "kernel"
               for o in s["out"]}
    assert written == {"float32"}


class Slices(torch.nn.Module):
    def forward(self, x):
        return (x[:, 1:] * 2 + x[:, :-1], x[:, -1] + x[:, 0], x[:, 3:] + 1, x[:, -3:] + 1,
                x[:, 1:][:, 1:] + 1)


def test_slices_along_a_dynamic_dim(tmp_path):
    """Slices and selects along a dynamic dim are index remaps where ATen's index rules are
    provable for every size in the declared range (5..16): `x[:, -3:]` starts at `seq - 3`,
    provable from the range's minimum (not for every seq >= 1; see test_constfold's
    declared-minima proofs). Every size in the range matches eager; a smaller one is refused."""
    path = aotc.export(Slices(), (torch.randn(3, 10),), tmp_path / "s.aotc",
                       dynamic_shapes=({1: Dim("seq", min=5, max=16)},))
    stats = json.loads((path / "plans/forward.json").read_text())["stats"]
    assert stats["fallback"] == {}
    assert stats["lowered"]["aten::slice.Tensor"] == 6 and stats["lowered"]["aten::select.int"] == 2
    m = aotc.load(path)
    for seq in range(5, 17):
        x = torch.randn(3, seq)
        for got, want in zip(m(x), Slices()(x), strict=True):
            torch.testing.assert_close(got, want)
    with pytest.raises(aotc.GuardError):
        m(torch.randn(3, 4))


def test_manifest_records_symbols_and_symbolic_shapes(artifacts):
    m = aotc.load(artifacts["transformer"])
    spec = m.entries["forward"].spec
    assert spec.to_json()["inputs"][0]["shape"] == ["batch", "seq", 128]
    assert spec.symbols["batch"].min == 1 and spec.symbols["batch"].max == 8
    assert spec.symbols["seq"].to_json() == {"min": 2, "max": 128, "example": 16}
    assert "batch" in m.signature() and "seq" in m.signature()


@pytest.mark.parametrize("size,where", [(9, "dim 0"), (0, "dim 0")])
def test_sizes_outside_the_range_raise_guard_error(artifacts, size, where):
    m = aotc.load(artifacts["transformer"])
    with pytest.raises(aotc.GuardError) as e:
        m(torch.randn(size, 16, 128))
    msg = str(e.value)
    assert "'x'" in msg and where in msg and "batch" in msg and "[1, 8]" in msg
    assert str(size) in msg
    out = m(torch.randn(2, 16, 128))          # still usable
    assert out["hidden"].shape == (2, 16, 128)


def test_seq_outside_range_names_the_dim(artifacts):
    m = aotc.load(artifacts["gpt2"])
    with pytest.raises(aotc.GuardError, match=r"dim 1.*seq=129.*\[2, 128\]"):
        m(torch.randint(0, 10, (2, 129)))


def test_shared_dim_name_means_equal_sizes(tmp_path):
    class Two(torch.nn.Module):
        def forward(self, a, b):
            return a * 2 + b

    x = torch.randn(4, 8)
    batch = Dim("batch", min=2, max=32)
    p = aotc.export(Two(), (x, x), tmp_path / "two.aotc",
                    dynamic_shapes={"a": {0: batch}, "b": {0: batch}})
    m = aotc.load(p)
    torch.testing.assert_close(m(torch.ones(5, 8), torch.ones(5, 8)), torch.full((5, 8), 3.0))
    with pytest.raises(aotc.GuardError, match=r"batch=3.*batch=5"):
        m(torch.ones(5, 8), torch.ones(3, 8))


def test_dynamic_dim_with_example_size_one_is_refused_with_the_fix(tmp_path):
    with pytest.raises(aotc.UsageError, match="at least 2"):
        parse_input_specs(["batch=1[1..8]x4"])
    with pytest.raises(aotc.UsageError, match="example size"):
        aotc.export(torch.nn.Linear(4, 2), (torch.randn(1, 4),), tmp_path / "one.aotc",
                    dynamic_shapes=({0: Dim("batch", min=1, max=8)},))


def test_model_that_fixes_a_dynamic_dim_names_the_line(tmp_path):
    model_file = Path(__file__).parent / "models" / "fixed_batch.py"
    with pytest.raises(aotc.ExportError) as e:
        export_file(str(model_file) + ":Net", parse_input_specs(["batch=8[1..64]x16"]),
                    tmp_path / "fixed.aotc")
    assert "fixed_batch.py" in str(e.value.where) and "FIXES-BATCH" in str(e.value.where)


def test_cli_run_accepts_sizes(artifacts):
    out = subprocess.run([sys.executable, "-m", "aotc.cli.main", "run", str(artifacts["mlp"]),
                          "--size", "batch=5", "--runs", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "float32[5, 10]" in out.stdout


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 64))
def test_property_any_batch_matches_eager(artifacts, batch):
    m = aotc.load(artifacts["mlp"])
    model = build("mlp", "Net")
    x = torch.randn(batch, 64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), rtol=1e-5, atol=1e-5)


def test_no_compiler_runs_after_load(artifacts, monkeypatch):
    m = aotc.load(artifacts["transformer"])

    def refuse(*a, **k):
        raise AssertionError("a process started after load")
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    for b, s in [(1, 2), (8, 128), (3, 17)]:
        assert m(torch.randn(b, s, 128))["hidden"].shape == (b, s, 128)


def test_strided_slice_along_a_dynamic_dim(tmp_path):
    """`x[:, 1::2]` along seq has floor((seq - 1)/2) + 1 elements: sizes with floor and ceiling
    print as Python integer expressions that plans and the runtime read back."""
    class Strided(torch.nn.Module):
        def forward(self, x):
            return x[:, 1::2] * 2, x[:, ::3] + 1
    p = aotc.export(Strided(), (torch.randn(3, 10),), tmp_path / "s.aotc",
                    dynamic_shapes=({1: Dim("seq", min=4, max=64)},))
    m = aotc.load(p)
    for s in (4, 5, 10, 33, 64):
        x = torch.randn(3, s)
        for got, want in zip(m(x), Strided()(x)):
            torch.testing.assert_close(got, want)


def test_symbolic_sizes_print_as_python_integer_expressions():
    import sympy
    from aotc.codegen.ir import sym
    from aotc.exporter.symbols import SymbolNamer
    seq = sympy.Symbol("seq", integer=True, positive=True)
    name = SymbolNamer().expr
    for e in (sympy.floor(seq / 2), sympy.floor((seq - 1) / 2) + 1, sympy.ceiling(seq / 3)):
        text = name(e)
        for v in (1, 2, 7, 64):
            assert eval(text, {"seq": v}) == int(e.subs(seq, v)), text
        assert sym(text).subs(sym("seq"), 7) == e.subs(seq, 7)
