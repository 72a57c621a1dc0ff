"""Sampled generation (runtime/sampling.py): with the same seed, a generator's tokens equal
transformers' `generate(do_sample=True, temperature=, top_k=, top_p=)` of the same model (fp32:
the same logits up to rounding, the same processors in the same order, the same draws); the
processors against their definitions; arguments out of range are UsageErrors."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.errors import UsageError
from aotc.runtime.sampling import Choice


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from benchmarks.generate_families import build
    m = build("llama")
    ids = torch.randint(1, 500, (2, 7), generator=torch.Generator().manual_seed(2))
    path = aotc.export(m, (ids,), tmp_path_factory.mktemp("s") / "l.aotc", decode=True,
                       max_cache_len=64)
    return m, ids, aotc.load(path)


@pytest.mark.parametrize("kw", [
    dict(temperature=0.7), dict(top_k=20, temperature=1.3), dict(top_p=0.8),
    dict(min_p=0.3, temperature=0.1), dict(repetition_penalty=3.0, temperature=0.05),
    dict(temperature=0.9, top_k=50, top_p=0.95, min_p=0.02, repetition_penalty=1.1),
    dict(do_sample=False, repetition_penalty=1.5)],
    ids=["temperature", "top-k", "top-p", "min-p", "penalty", "all", "greedy-penalty"])
def test_sampling_matches_transformers_with_the_same_seed(llama, kw):
    m, ids, loaded = llama
    kw = {"do_sample": True, **kw}
    full = {**dict(temperature=1.0, top_k=0, top_p=1.0), **kw}
    torch.manual_seed(7)
    with torch.no_grad():
        want = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                          cache_implementation="static", pad_token_id=0, **full)
    torch.manual_seed(7)
    got = loaded.generate(ids, 24, **kw)
    assert torch.equal(got, want)
    gen = torch.Generator().manual_seed(7)           # a generator of one's own: the same draws
    again = loaded.generate(ids, 24, generator=gen, **kw)
    assert torch.equal(again, want)
    for key in ("repetition_penalty", "min_p"):      # alone, each changes the tokens
        if key in kw and len(kw) <= 3:
            torch.manual_seed(7)
            plain = {k: v for k, v in kw.items() if k != key}
            assert not torch.equal(loaded.generate(ids, 24, **plain), want), key


def test_processors_keep_what_they_should():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0]])
    top2 = Choice(True, top_k=2).scores(logits)
    assert torch.isfinite(top2).tolist() == [[True, False, False, False, True]]
    # probabilities 0.62, 0.23, 0.084, 0.051, 0.011: the two most likely hold 0.85 >= 0.8
    nucleus = Choice(True, top_p=0.8).scores(logits)
    assert torch.isfinite(nucleus).tolist() == [[True, False, False, False, True]]
    only = Choice(True, top_p=0.01).scores(logits)    # the most likely is always kept
    assert torch.isfinite(only).sum() == 1 and torch.isfinite(only)[0, 4]
    hot = Choice(True, temperature=0.5).scores(logits)
    torch.testing.assert_close(hot, logits * 2)
    draws = torch.cat([Choice(True, top_k=1)(logits) for _ in range(20)])
    assert (draws == 4).all()


@pytest.mark.parametrize("kw,name", [(dict(temperature=0.0), "temperature"),
                                     (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
                                     (dict(top_p=1.5), "top_p"), (dict(top_p=0), "top_p"),
                                     (dict(min_p=-0.1), "min_p"),
                                     (dict(repetition_penalty=0), "repetition_penalty")])
def test_sampling_arguments_out_of_range_are_usage_errors(llama, kw, name):
    _, ids, loaded = llama
    with pytest.raises(UsageError, match=f"sampling's {name} is out of range") as e:
        loaded.generate(ids, 4, do_sample=True, **kw)
    assert e.value.fix


def test_sampling_arguments_without_do_sample_are_refused(llama):
    _, ids, loaded = llama
    with pytest.raises(UsageError, match="apply only to sampling"):
        loaded.generate(ids, 4, temperature=0.5)
    with pytest.raises(UsageError, match="apply only to sampling"):
        loaded.generate(ids, 4, min_p=0.1)


def test_cli_generate_samples(llama, tmp_path):
    """`aotc generate --temperature/--top-p` times sampled generation; a bad value is a
    UsageError (exit code 2) that names it."""
    from conftest import run_aotc
    path = llama[2].path
    proc = run_aotc("generate", path, "--prompt-len", "5", "--new-tokens", "8", "--runs", "1",
                    "--temperature", "0.8", "--top-p", "0.9")
    assert proc.returncode == 0, proc.stderr
    assert "sampled (temperature=0.8, top_p=0.9)" in proc.stdout
    assert "runs differ" not in proc.stdout          # every run draws from the same seed
    proc = run_aotc("generate", path, "--top-p", "2")
    assert proc.returncode == 2 and "sampling's top_p is out of range" in proc.stderr
