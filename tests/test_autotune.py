"""`--autotune` for the Triton backend, without a GPU (codegen/triton/autotune.py, blocks.py).

  (a) candidates: the heuristic first, distinct configs, bounded sizes;
  (b) block overrides are correct: every candidate of a few op patterns cross-compiles for
      sm_90 and gives the heuristic's numbers under Triton's interpreter (the Tuner's own check,
      run with an interpreter loader), and artifacts built with each candidate match eager;
  (c) the Tuner's choice (3% rule, rejected candidates) with an injected launcher and timer;
  (d) options: autotune with a cpu target is a usage error; without a GPU (or with one of
      another arch) export succeeds and the manifest says why tuning was skipped.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aotc
from aotc.api import compile_function
from aotc.cli.main import main
from aotc.cli.report import inspect_text
from aotc.codegen import _buffers, _stored, lower_and_schedule
from aotc.codegen.scheduler import Kernel
from aotc.codegen.triton import autotune
from aotc.codegen.triton.autotune import MAX_CANDIDATES, MAX_ELEMENTS, Tuner, candidates
from aotc.codegen.triton.blocks import (FEW_ROWS_LOOP, MAX_PERSISTENT, BlockConfig, SizeHints,
                                        heuristic_config, plan_blocks)
from aotc.errors import LoweringError, UsageError
from aotc.exporter import trace_function
from aotc.options import ExportOptions
from aotc.artifact import format as fmt
from aotc.runtime.cuda import CudaLauncher
from aotc.runtime.interpret import import_kernel
from conftest import SAMPLES, assert_matches

triton = pytest.importorskip("triton")
# every load and store of an interpreted artifact kernel stays inside its tensors
from test_triton import interpreted_accesses_stay_in_bounds  # noqa: E402, F401

TARGET = "cuda:sm_90"

# op patterns: (function, example inputs); what their kernels exercise. Seeded inputs: a sum of
# 5120 floats in another block order differs from eager's by ~1e-5 relative on some draws
_gen = torch.Generator().manual_seed(0)
PATTERNS = {
    # persistent reductions (single blocks) and pointwise over the same rows
    "softmax": (lambda x: torch.softmax(x, -1), (torch.randn(6, 40, generator=_gen),)),
    # a persistent Welford reduction, then a pointwise node looping over 1100 elements
    "layer_norm": (lambda x: F.layer_norm(x, (1100,)), (torch.randn(3, 1100, generator=_gen),)),
    # pointwise split over grid axis 1, with a broadcast operand; the heuristic's blocks
    # divide rows and columns, some candidates' do not (so they need masks it has none of)
    "pointwise": (lambda x, y: (x + y).relu() * 2,
                  (torch.randn(6, 3072, generator=_gen), torch.randn(3072, generator=_gen))),
    # looped reductions (rows > MAX_PERSISTENT): sum, two-pass variance, argmax; 1024 divides
    # the rows, 2048 does not
    "looped": (lambda x: (x.sum(-1), x.var(-1), x.argmax(-1)),
               (torch.randn(2, 5120, generator=_gen),)),
    # an outer reduction (48 contiguous columns, 4 x 25 strided rows reduced): a wide XBLOCK,
    # R blocks looped over the 100 rows (ragged), three reductions in one kernel
    "outer": (lambda x: (x.sum((0, 1)), x.amax((0, 1)), (x * x).sum((0, 1))),
              (torch.randn(4, 25, 48, generator=_gen),)),
}


def kernels_of(fn, args) -> tuple[list, dict, set]:
    """(scheduled kernels, buffers, stored names) of `fn` traced on `args`."""
    lowered, steps, _ = lower_and_schedule(trace_function(fn, args))
    return ([s for s in steps if isinstance(s, Kernel)], _buffers(lowered.slots),
            _stored(steps, lowered.outputs))


# ---------------------------------------------------------------------------- (a) candidates

@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_candidates_start_with_the_heuristic_and_are_distinct(name):
    kernels, buffers, _ = kernels_of(*PATTERNS[name])
    for k in kernels:
        configs = candidates(k, buffers)
        assert configs[0] == heuristic_config(plan_blocks(k, buffers))
        assert 1 < len(configs) <= MAX_CANDIDATES and len(set(configs)) == len(configs)
        for c in configs:
            blocks = plan_blocks(k, buffers, c)
            assert heuristic_config(blocks) == c          # each is the config it plans to
            assert blocks.xblock * blocks.widest <= MAX_ELEMENTS
            assert c.rblock is None or 16 <= c.rblock <= 8192
            assert c.num_warps in (1, 2, 4, 8, 16)
        assert configs == candidates(k, buffers)          # deterministic


def test_persistent_reduction_blocks_hold_the_row_whatever_the_config():
    (k,), buffers, _ = kernels_of(*PATTERNS["softmax"])
    configs = candidates(k, buffers)
    assert all(c.rblock is None for c in configs)          # no node loops or splits
    assert {c.xblock for c in configs} == {4, 8} and len({c.num_warps for c in configs}) == 3
    for c in configs + [BlockConfig(rblock=16)]:
        assert [(b.mode, b.size) for b in plan_blocks(k, buffers, c).nodes] == [("single", 64)] * 3


def test_looped_reduction_candidates_vary_the_loop_block():
    (k,), buffers, _ = kernels_of(*PATTERNS["looped"])
    assert plan_blocks(k, buffers).rows == 2 and 5120 > MAX_PERSISTENT
    configs = candidates(k, buffers)   # 2 rows: a few-row kernel loops 8192 at a time
    assert {c.rblock for c in configs} == {FEW_ROWS_LOOP // 2, FEW_ROWS_LOOP}
    for c in configs:
        modes = {(b.mode, b.size) for b in plan_blocks(k, buffers, c).nodes if b.rb}
        assert modes == {("loop", c.rblock)}


def test_overrides_recompute_masks():
    """Masks follow the final sizes: an R block dividing the row needs no rmask, a ragged one
    does; XBLOCK dividing the rows needs no xmask."""
    (k,), buffers, _ = kernels_of(lambda x: F.layer_norm(x, (3072,)) * 2, (torch.randn(8, 3072),))
    modes = lambda blocks: [(b.mode, b.size, b.rmask) for b in blocks.nodes]  # noqa: E731
    base = plan_blocks(k, buffers)   # 8 rows: few enough for one block per node (FEW_ROWS)
    assert modes(base) == [("single", 4096, "rmask0"), ("single", 4096, "rmask1")]
    assert not base.xmask and base.num_warps == 8
    (k64,), buffers64, _ = kernels_of(lambda x: F.layer_norm(x, (3072,)) * 2,
                                      (torch.randn(64, 3072),))
    assert modes(plan_blocks(k64, buffers64)) == [("single", 4096, "rmask0"), ("loop", 1024, None)]
    ragged = plan_blocks(k, buffers, BlockConfig(rblock=2048, xblock=4))
    assert modes(ragged) == [("single", 4096, "rmask0"), ("loop", 2048, "rmask1")]
    assert not ragged.xmask
    exact = plan_blocks(k, buffers, BlockConfig(rblock=512, xblock=16))
    assert modes(exact) == [("single", 4096, "rmask0"), ("loop", 512, None)]
    assert exact.xblock == 8 and not exact.xmask
    (k,), buffers, _ = kernels_of(*PATTERNS["layer_norm"])      # 3 rows of 1100
    for rblock, xblock in ((512, 2), (16, 4), (2048, 1)):
        blocks = plan_blocks(k, buffers, BlockConfig(xblock=xblock, rblock=rblock, num_warps=2))
        assert [(b.mode, b.size, b.rmask is not None) for b in blocks.nodes] == [
            ("single", 2048, True), ("loop", rblock, True)]
        assert blocks.xblock == xblock and blocks.xmask == (3 % xblock != 0)
        assert blocks.num_warps == 2
    assert plan_blocks(k, buffers, BlockConfig(xblock=64)).xblock == 4   # pow2(3 rows)
    assert plan_blocks(k, buffers, BlockConfig(rblock=4096)).nodes[1].size == 2048   # pow2(1100)
    with pytest.raises(ValueError, match="power of two"):
        BlockConfig(xblock=3)


# ------------------------------------------------- (b) every candidate compiles and is correct

class Forced:
    """A tuner that builds every kernel with its `j`-th candidate (its last, if fewer)."""

    def __init__(self, j: int):
        self.j = j

    def tune(self, kernels, buffers, stored, first_code):
        out = {}
        for k in kernels:
            configs = candidates(k, buffers)
            out[k.name] = (configs[min(self.j, len(configs) - 1)], None)
        return out

    def summary(self) -> dict:
        return {"forced": self.j}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_artifacts_built_with_each_candidate_match_eager(name, tmp_path, monkeypatch):
    """The block overrides are correct: with each candidate config, the kernels cross-compile
    for sm_90 and, run by Triton's interpreter (every access checked to stay inside its
    tensors), give eager's numbers."""
    fn, args = PATTERNS[name]
    want = fn(*args)
    kernels, buffers, _ = kernels_of(fn, args)
    count = max(len(candidates(k, buffers)) for k in kernels)
    for j in range(count):
        monkeypatch.setattr(autotune, "local_tuner", lambda archs, sizes: (Forced(j), None))
        p = compile_function(fn, args, tmp_path / f"{j}.aotc", target=TARGET, autotune=True)
        for k in kernels:
            spec = json.loads((p / fmt.triton_launch_file(k.name)).read_text())
            config = candidates(k, buffers)[min(j, len(candidates(k, buffers)) - 1)]
            assert (spec["constexprs"]["XBLOCK"], spec["num_warps"]) == (config.xblock,
                                                                         config.num_warps)
            assert (p / fmt.triton_cubin_file(k.name, "sm_90")).read_bytes()[:4] == b"\x7fELF"
        assert_matches(aotc.load(p, device="cpu", interpret=True)(*args), want)


class Bench:
    """What a Tuner runs candidates with on the CPU: Triton's interpreter, and a timer that
    looks a candidate's time up in `times` (candidate index -> us) instead of running it.
    Candidates in `broken` add 1 to their first output."""

    def __init__(self, tmp_path, times, broken=()):
        self.path, self.times, self.broken = tmp_path, times, broken
        self.timing, self.ran = False, None

    def load(self, ks, text, cubin, meta):
        if meta:   # a real build: the runtime's own launcher, as the GPU loader makes it
            from types import SimpleNamespace
            owner = SimpleNamespace(device=torch.device("cpu"))
            launcher = CudaLauncher(ks.name, None, None, autotune.candidate_build(meta),
                                    SimpleNamespace(inputs=tuple(ks.ins)), owner)
            assert launcher.threads == 32 * meta["num_warps"]
            assert len(launcher.user) >= len(ks.ins)
        path = self.path / f"{ks.name}.py"
        path.write_text(text)
        fn, j = import_kernel(text, ks.name, str(path)), int(ks.name.rpartition("_c")[2])

        def launch(grid, *args):
            self.ran = j
            if self.timing:
                return
            with np.errstate(all="ignore"):
                fn[tuple(grid)](*args, **ks.constexprs)
            if j in self.broken:
                args[len(ks.ins)].view(-1)[0] += 1.0
        return launch

    def timer(self, fn) -> float:
        self.timing = True
        try:
            fn()
        finally:
            self.timing = False
        return self.times(self.ran) if callable(self.times) else self.times[self.ran]

    def tuner(self, **kwargs) -> Tuner:
        return Tuner("cpu", "sm_90", {}, load=self.load, timer=self.timer, **kwargs)


def favour_last(j: int) -> float:
    return 100.0 / (1 + j)


@pytest.mark.parametrize("name", ["pointwise", "softmax"])
def test_the_tuner_runs_every_candidate(name, tmp_path, monkeypatch):
    """The Tuner end to end, its candidates compiled for sm_90 and run by the interpreter:
    none is rejected, the one timed fastest is built, and the artifact matches eager."""
    fn, args = PATTERNS[name]
    monkeypatch.setattr(autotune, "local_tuner",
                        lambda archs, sizes: (Bench(tmp_path, favour_last).tuner(), None))
    p = compile_function(fn, args, tmp_path / "a.aotc", target=TARGET, autotune=True)
    native = fmt.read_manifest(p).target.native
    summary = native.autotune
    assert summary["kernels"] == len(native.kernels) == summary["tuned"] == summary["changed"]
    assert summary["rejected"] == 0 and summary["device"] == "cpu" and summary["arch"] == "sm_90"
    for k in native.kernels:
        spec = json.loads((p / fmt.triton_launch_file(k)).read_text())
        record = spec["autotune"]
        assert all("rejected" not in c for c in record["candidates"])
        assert record["chosen"] == record["candidates"][-1]["config"] != record["heuristic"]
        assert spec["constexprs"]["XBLOCK"] == record["chosen"]["xblock"]
        assert spec["archs"]["sm_90"]["num_warps"] == record["chosen"]["num_warps"]
    assert_matches(aotc.load(p, device="cpu", interpret=True)(*args), fn(*args))
    text = inspect_text(p, fusion=True)
    assert f"autotune: {summary['tuned']} of {summary['kernels']} kernels timed on cpu" in text
    assert "(heuristic XBLOCK" in text


def test_kernels_of_one_shape_are_tuned_once(tmp_path, monkeypatch):
    # two softmaxes of one shape around a product: the second kernel takes the first's choice
    # (codegen/triton/build.py code_free_shape) without candidates of its own
    def fn(x, w):
        return torch.mm(torch.softmax(x, -1) * 2, w).softmax(-1) * 2
    args = (torch.randn(8, 32), torch.randn(32, 32))
    monkeypatch.setattr(autotune, "local_tuner",
                        lambda archs, sizes: (Bench(tmp_path, favour_last).tuner(), None))
    p = compile_function(fn, args, tmp_path / "s.aotc", target=TARGET, autotune=True)
    native = fmt.read_manifest(p).target.native
    records = {k: json.loads((p / fmt.triton_launch_file(k)).read_text())["autotune"]
               for k in native.kernels}
    first, second = sorted(records, key=lambda k: int(k.rpartition("kernel")[2]))
    assert "candidates" in records[first] and "candidates" not in records[second]
    assert records[second]["skipped"] == f"the shape of {first}, tuned there"
    assert records[second]["chosen"] == records[first]["chosen"] != records[first]["heuristic"]
    assert native.autotune["tuned"] == 1 and native.autotune["kernels"] == 2
    assert_matches(aotc.load(p, device="cpu", interpret=True)(*args), fn(*args))


def test_dynamic_dims_are_tuned_at_their_example_sizes(tmp_path, monkeypatch):
    class Net(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1) * 2 + x.sum(-1, keepdim=True)
    bench = Bench(tmp_path, favour_last)
    monkeypatch.setattr(autotune, "local_tuner", lambda archs, hints: (Tuner(
        "cpu", "sm_90", hints.example, load=bench.load, timer=bench.timer,
        maximum=hints.maximum), None))
    batch = torch.export.Dim("batch", min=1, max=64)
    p = aotc.export(Net(), (torch.randn(6, 40),), tmp_path / "m.aotc", target=TARGET,
                    autotune=True, dynamic_shapes=({0: batch},))
    m = fmt.read_manifest(p)
    assert m.options["autotune"] is True
    summary = m.target.native.autotune
    assert summary["sizes"] == {"batch": 6} and summary["changed"] == summary["kernels"] == 1
    assert "at batch=6" in inspect_text(p)
    model = aotc.load(p, device="cpu", interpret=True)
    for n in (1, 6, 17):
        x = torch.randn(n, 40)
        assert_matches(model(x), Net()(x))


# ------------------------------------------------------------------- (c) the Tuner's choice

def no_build(jobs):
    return [(b"", {})] * len(jobs)


@pytest.mark.parametrize("fast, chosen", [(97.5, 0), (96.9, 2)])
def test_the_heuristic_stays_unless_another_is_3_percent_faster(tmp_path, fast, chosen):
    (k,), buffers, stored = kernels_of(*PATTERNS["softmax"])
    times = {0: 100.0, 1: 101.0, 2: fast, 3: 99.0, 4: 150.0}
    config, record = Bench(tmp_path, times).tuner(build=no_build).tune(
        [k], buffers, stored)[k.name]
    configs = candidates(k, buffers)
    assert config == configs[chosen] and record["chosen"] == configs[chosen].to_json()
    assert record["heuristic_us"] == 100.0 and record["best_us"] == fast
    assert record["chosen_us"] == times[chosen]
    assert [c["us"] for c in record["candidates"]] == [times[j] for j in range(len(configs))]


def test_candidates_whose_outputs_differ_are_rejected(tmp_path):
    (k,), buffers, stored = kernels_of(*PATTERNS["softmax"])
    tuner = Bench(tmp_path, {0: 10.0, 1: 9.0, 2: 1.0, 3: 9.5, 4: 9.9}, broken={2}).tuner(
        build=no_build)
    config, record = tuner.tune([k], buffers, stored)[k.name]
    rows = record["candidates"]
    assert "differs from the heuristic's" in rows[2]["rejected"] and rows[2]["us"] is None
    assert all("rejected" not in r for i, r in enumerate(rows) if i != 2)
    assert config == candidates(k, buffers)[1] and record["best_us"] == 9.0
    summary = tuner.summary()
    assert (summary["kernels"], summary["tuned"], summary["changed"], summary["rejected"]) == (
        1, 1, 1, 1)
    assert summary["heuristic_us_total"] == 10.0 and summary["chosen_us_total"] == 9.0


def test_a_candidate_that_does_not_compile_is_rejected(tmp_path):
    (k,), buffers, stored = kernels_of(*PATTERNS["softmax"])

    def build(jobs):
        if any(ks.name.endswith("_c1") for ks, _, _ in jobs):
            raise LoweringError("Triton could not compile it")
        return no_build(jobs)
    config, record = Bench(tmp_path, favour_last).tuner(build=build).tune(
        [k], buffers, stored)[k.name]
    rows = record["candidates"]
    assert rows[1]["rejected"] == "does not compile: Triton could not compile it"
    assert [r["us"] is not None for r in rows] == [True, False, True, True, True]
    assert config == candidates(k, buffers)[-1]


def test_a_kernel_with_one_candidate_is_not_timed(monkeypatch):
    (k,), buffers, stored = kernels_of(*PATTERNS["softmax"])
    monkeypatch.setattr(autotune, "candidates",
                        lambda k, b, hints=None: [heuristic_config(plan_blocks(k, b))])
    tuner = Tuner("cpu", "sm_90", {}, load=pytest.fail, timer=pytest.fail, build=pytest.fail)
    config, record = tuner.tune([k], buffers, stored)[k.name]
    assert config == heuristic_config(plan_blocks(k, buffers))
    assert record == {"chosen": config.to_json(), "heuristic": config.to_json(),
                      "skipped": "no other candidate"}
    assert tuner.summary()["tuned"] == 0


# ---------------------------------------------------------------------------- (d) options

def test_autotune_with_a_cpu_target_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="--autotune") as e:
        ExportOptions(autotune=True)
    assert "cuda" in e.value.fix
    with pytest.raises(UsageError):
        aotc.export(SAMPLES["mlp"].build(), (torch.randn(2, 64),), tmp_path / "m.aotc",
                    autotune=True)
    assert not (tmp_path / "m.aotc").exists()


def test_cli_autotune_with_a_cpu_target_exits_2(tmp_path):
    from click.testing import CliRunner
    out = tmp_path / "out.aotc"
    result = CliRunner().invoke(main, ["export", SAMPLES["mlp"].ref, "-i", "32x64",
                                       "--autotune", "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "--autotune" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_autotune_without_a_gpu_is_skipped_and_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fn, args = PATTERNS["softmax"]
    p = compile_function(fn, args, tmp_path / "a.aotc", target=TARGET, autotune=True)
    native = fmt.read_manifest(p).target.native
    assert "no CUDA GPU" in native.autotune["skipped"]
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "--autotune" in ln]
    assert len(warned) == 1 and warned[0].startswith("aotc: warning: --autotune skipped: ")
    plain = compile_function(fn, args, tmp_path / "b.aotc", target=TARGET)
    assert fmt.read_manifest(plain).target.native.autotune is None
    for k in native.kernels:   # the heuristic's kernels, as without --autotune
        for f in (fmt.triton_launch_file(k), fmt.triton_source_file(k)):
            assert (p / f).read_bytes() == (plain / f).read_bytes()
    assert "autotune: skipped: this machine has no CUDA GPU" in inspect_text(p)


def test_autotune_with_a_gpu_of_another_arch_is_skipped(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    tuner, reason = autotune.local_tuner(["sm_90"], SizeHints({}, {}))
    assert tuner is None and "sm_80" in reason and "sm_90" in reason
