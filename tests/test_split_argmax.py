"""argmax / argmin of long rows in two stages for CUDA targets (codegen/lowering/split_arg.py):
the chunk plan, the plan's kernels, and results equal to eager's through Triton's interpreter -
first occurrences on rows of ties, NaN winning, masked tail chunks, a reduced dim that is not
the last, fp32 and bf16."""
from __future__ import annotations

import json

import pytest
import torch

from aotc.api import compile_function
from aotc.codegen.lowering.split_arg import plan_chunks

triton = pytest.importorskip("triton")
from test_triton import interpreted, interpreted_accesses_stay_in_bounds  # noqa: E402, F401

TARGET = "cuda:sm_90"


def test_the_chunk_plan():
    assert plan_chunks(1, 32000) == (32, 1000)            # LLaMA's vocabulary
    assert plan_chunks(8, 50257) == (33, 1523)             # GPT-2's, ragged: the last masked
    chunks, c = plan_chunks(1, 151936)
    assert chunks == 149 and chunks * c >= 151936 > (chunks - 1) * c
    assert plan_chunks(1, 4095) is None                    # one persistent block does it
    assert plan_chunks(200, 32000) is None                 # rows enough to fill the GPU


def _rows(shape, dtype, kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(shape, generator=g).to(dtype)
    x = torch.randint(-3, 4, shape, generator=g).to(dtype)   # many ties
    if kind == "special":
        x.view(-1)[::977] = float("nan")
        x[0].fill_(float("-inf"))                             # a row of -inf: index 0
        x[-1].view(-1)[-1] = float("inf")                     # in the masked tail chunk
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_split_argmax_matches_eager_through_the_interpreter(dtype, tmp_path):
    def fn(x, y):
        return x.argmax(-1), (x * 2).argmin(-1, keepdim=True), y.argmax(1)
    x, y = _rows((2, 4100), dtype, "random"), _rows((3, 5000, 2), dtype, "random")
    m = interpreted(fn, (x, y), tmp_path / "a.aotc")
    plan = json.loads((tmp_path / "a.aotc" / "plans/forward.json").read_text())
    assert sum("argmax_chunks" in op for s in plan["steps"] for f in s.get("fused", [])
               for op in f["ops"]) >= 3                   # each of the three in two stages
    for kind in ("random", "ties", "special"):
        args = (_rows((2, 4100), dtype, kind, 1), _rows((3, 5000, 2), dtype, kind, 2))
        for got, want in zip(m(*args), fn(*args)):
            assert torch.equal(got, want), kind


def test_cpu_targets_keep_one_stage(tmp_path):
    fn, args = (lambda x: x.argmax(-1)), (torch.randn(2, 32000),)
    for target, kernels in (("cpu", 1), (TARGET, 2)):
        p = compile_function(fn, args, tmp_path / f"{target[:3]}.aotc", target=target)
        assert json.loads((p / "plans/forward.json").read_text())["stats"]["kernels"] == kernels
