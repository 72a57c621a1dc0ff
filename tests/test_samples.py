"""End to end: every sample exported, loaded, run and compared with eager (fp32, tight tolerance)."""
from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

import aotc
from aotc.cli.main import main
from conftest import SAMPLES, assert_matches, eager, flat_tensors, snapshot

ALL = list(SAMPLES)
STRUCTURED = {"transformer": ["hidden", "pooled"], "gpt2": ["last_hidden_state"],
              "bert": ["last_hidden_state", "pooler_output"]}


@pytest.mark.parametrize("name", ALL)
def test_export_load_run_matches_eager(exported, name):
    ex = exported(name)
    m = aotc.load(ex.path)
    assert isinstance(m, aotc.CompiledModule)
    # Fresh inputs, not the export-time examples: the artifact must compute, not replay.
    for seed in (1, 2):
        inputs = SAMPLES[name].inputs(seed)
        assert_matches(m(*inputs), eager(ex.model, inputs))
    # ... and the example inputs too.
    assert_matches(m(*ex.inputs), eager(ex.model, ex.inputs))


@pytest.mark.parametrize("name", ALL)
def test_output_structure_preserved(exported, name):
    ex = exported(name)
    out = aotc.load(ex.path)(*ex.inputs)
    want = eager(ex.model, ex.inputs)
    if name in STRUCTURED:
        assert type(out) is dict
        assert list(out) == STRUCTURED[name]
        assert list(want.keys()) == STRUCTURED[name]
    else:
        assert isinstance(out, torch.Tensor)
    assert_matches(out, want)


@pytest.mark.parametrize("name", ALL)
def test_run_flat_and_recorded_samples(exported, name):
    ex = exported(name)
    m = aotc.load(ex.path)
    want = flat_tensors(eager(ex.model, ex.inputs))
    flat = m.run_flat("forward", ex.inputs)
    assert isinstance(flat, tuple) and len(flat) == len(want)
    for g, w in zip(flat, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    ins, outs = m.recorded_samples()
    assert len(ins) == len(ex.inputs)
    for g, w in zip(ins, ex.inputs):
        assert torch.equal(g, w)
    assert len(outs) == len(want)
    for g, w in zip(outs, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_random_inputs_satisfy_guards_and_match_eager(exported, name):
    ex = exported(name)
    m = aotc.load(ex.path)
    inputs = m.random_inputs(seed=3)
    assert [tuple(t.shape) for t in inputs] == [tuple(t.shape) for t in ex.inputs]
    assert [t.dtype for t in inputs] == [t.dtype for t in ex.inputs]
    for t, spec in zip(inputs, m.inputs):
        if spec.values is not None:
            lo, hi = spec.values
            assert lo <= int(t.min()) and int(t.max()) <= hi
    assert_matches(m(*inputs), eager(ex.model, inputs))


def test_check_guards_false_still_correct(exported):
    ex = exported("transformer")
    m = aotc.load(ex.path, check_guards=False)
    inputs = SAMPLES["transformer"].inputs(5)
    assert_matches(m(*inputs), eager(ex.model, inputs))


def test_non_contiguous_input(exported):
    ex = exported("mlp")
    m = aotc.load(ex.path)
    x = torch.randn(64, 32).t()          # right shape, transposed strides
    assert not x.is_contiguous()
    assert_matches(m(x), eager(ex.model, (x,)))


def test_code_is_readable_python(mlp_artifact):
    code = aotc.load(mlp_artifact).code
    assert "def plan_forward(inputs, symbols):" in code
    assert "return (" in code
    compile(code, "<plan>", "exec")


def test_export_returns_path_and_repr(exported):
    ex = exported("bert")
    m = aotc.load(ex.path)
    assert "input_ids: int64[2, 32]" in repr(m)
    assert "last_hidden_state" in m.signature()


# ------------------------------------------------------------------------------- via the CLI

def test_cli_subprocess_export_matches_eager(cli_mlp_artifact):
    """`aotc export samples/mlp.py:Net -i 32x64` in a subprocess builds the model with seed 0."""
    sample = SAMPLES["mlp"]
    model = sample.build()
    m = aotc.load(cli_mlp_artifact)
    for seed in (0, 1):
        inputs = sample.inputs(seed)
        assert_matches(m(*inputs), eager(model, inputs))
    assert m.manifest.model["source"] == sample.ref
    assert m.manifest.model["name"] == "Net"


@pytest.mark.parametrize("name", ["transformer", "bert"])
def test_cli_export_in_process_matches_eager(name, tmp_path):
    sample = SAMPLES[name]
    model = sample.build()
    out = tmp_path / f"{name}.aotc"
    args = ["export", sample.ref, "-o", str(out)]
    for s in sample.cli_specs:
        args += ["-i", s]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    m = aotc.load(out)
    inputs = sample.inputs(7)
    assert_matches(m(*inputs), eager(model, inputs))
    if name == "bert":   # the declared range is recorded, not the observed min/max
        assert m.inputs[0].values == (0, 999)


def test_cli_export_reproducible_across_processes(cli_mlp_artifact, tmp_path, monkeypatch,
                                                 one_cpu_level):
    """The same command in another process (here: in-process, default -o) gives the same bytes."""
    from aotc.codegen.cpp import build
    monkeypatch.setattr(build, "auto_levels", one_cpu_level)   # every level, as the subprocess
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["export", SAMPLES["mlp"].ref, "-i", "32x64"])
    assert result.exit_code == 0, result.output
    default_out = tmp_path / "mlp.aotc"          # default: ./<file stem>.aotc
    assert default_out.is_dir()
    assert snapshot(default_out) == snapshot(cli_mlp_artifact)


# ------------------------------------------------------------------------- full-size (slow)

@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_full_size_hf_models(name, tmp_path):
    """GPT-2 small and BERT-base at their published sizes (random weights)."""
    pytest.importorskip("transformers")
    from conftest import SAMPLES_DIR, import_file
    module = import_file(SAMPLES_DIR / "hf_models.py")
    torch.manual_seed(0)
    model = getattr(module, name)(full=True).eval()
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    x = (torch.randint(0, vocab, (1, 64), generator=gen),)
    m = aotc.load(aotc.export(model, x, tmp_path / f"{name}.aotc"))
    y = (torch.randint(0, vocab, (1, 64), generator=gen),)
    assert_matches(m(*y), eager(model, y))


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "gpt2"])
def test_extern_only_artifacts_match_eager(tmp_path, name):
    """--no-codegen: every op an ATen call, the plan checked against each op's schema at load
    (numbers passed where ATen takes a tensor included)."""
    sample = SAMPLES[name]
    model, inputs = sample.build(), sample.inputs(seed=0)
    m = aotc.load(aotc.export(model, inputs, tmp_path / "x.aotc", codegen=False))
    assert m.library is None and m.manifest.target.portable
    assert_matches(m(*inputs), eager(model, inputs))
