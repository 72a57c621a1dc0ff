"""Tails (codegen/triton/tails.py): a kernel of a few programs run by the last program of the
kernel before it, found by a ticket counter in element 1 of the plan run's error flag."""
import json

import pytest
import torch

import aotc
from conftest import llama_sample

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    """The LLaMA sample at batch 1 exported for CUDA (one-row products: each RMSNorm a kernel of
    one program, each rotary embedding one of a few), and its CPU artifact's tokens."""
    tmp = tmp_path_factory.mktemp("tails")
    m = llama_sample(vocab=256)
    ids = torch.randint(1, 255, (1, 5), generator=torch.Generator().manual_seed(5))
    path = aotc.export(m, (ids,), tmp / "g.aotc", decode=True, max_cache_len=48,
                       target="cuda:sm_90")
    want = aotc.load(aotc.export(m, (ids,), tmp / "c.aotc", decode=True,
                                 max_cache_len=48)).generate(ids, 5)
    return path, ids, want


def _kernels(path, entry):
    plan = json.loads((path / "plans" / f"{entry}.json").read_text())
    return plan, [s for s in plan["steps"] if s["kind"] == "kernel"]


def test_small_static_kernels_become_the_tails_of_the_kernels_before(generator):
    path, _, _ = generator
    plan, steps = _kernels(path, "decode")
    tailed = [s for s in steps if "_tail(" in (path / "kernels" / f"{s['name']}.py").read_text()]
    ops = lambda s: {op.split(".")[0] for f in s["fused"] for op in f["ops"]}   # noqa: E731
    # every layer's two RMSNorms and the final one, and each rotary embedding
    assert len(tailed) >= 2 * 2 + 1
    assert sum("rsqrt" in ops(s) and "mm" in ops(s) for s in tailed) >= 4
    decisions = [d for d in plan["stats"]["fusion"] if "run by its last program" in d]
    assert len(decisions) == len(tailed)
    for s in tailed:   # a tail kernel takes the flag that holds the counter
        spec = json.loads((path / "kernels" / f"{s['name']}.json").read_text())
        assert "aotc_err" in [p["name"] for p in spec["params"]] and spec["error_code"]
        assert all(g.isdigit() for g in spec["grid"])


def test_dynamic_grids_get_no_tails(generator):
    path, _, _ = generator
    _, steps = _kernels(path, "prefill")     # the prompt length is dynamic
    assert not any("_tail(" in (path / "kernels" / f"{s['name']}.py").read_text()
                   for s in steps)


def test_tails_generate_what_the_cpu_artifact_does_and_leave_the_counter_at_zero(generator):
    """Through Triton's interpreter (programs in order: the last one runs the tail), the
    tokens are the CPU artifact's; every run's flag ends as zeros, its counter set back."""
    path, ids, want = generator
    gen = aotc.load(path, device="cpu", interpret=True, runner="python")
    flags, make = [], gen.library.new_error_flag
    gen.library.new_error_flag = lambda: flags.append(make()) or flags[-1]
    assert torch.equal(gen.generate(ids, 5), want)
    assert flags and all(f.tolist() == [0, 0] for f in flags)


def test_a_stale_counter_skips_the_tail(generator):
    """The ticket is the whole protocol: a counter not at 0 when the kernel starts means no
    program draws the last ticket, so the tail's outputs stay as they were (which is why
    the runtime allocates the flag with zeros at each run)."""
    path, ids, want = generator
    gen = aotc.load(path, device="cpu", interpret=True, runner="python")
    gen.library.new_error_flag = lambda: torch.tensor([0, 1000], dtype=torch.int32)
    assert not torch.equal(gen.generate(ids, 5), want)
