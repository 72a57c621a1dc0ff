"""Export time stays near-linear in graph size: index expressions of stacked reshapes (the
channel shuffle of ShuffleNet, window partitions of Swin and MaxViT) are folded as each view
is built, so a load's index grows by a few terms per view instead of multiplying (ShuffleNet
exported in 81 s, MaxViT did not finish C++ emission in 18 minutes)."""
import time

import sympy
import torch

from aotc.codegen import lower_and_schedule
from aotc.codegen.scheduler import Kernel, LoadRecorder
from aotc.codegen.ir import index_vars
from aotc.exporter import trace_function
from aotc import codegen as cg
from aotc.codegen.cpp.kernel import kernel_source


def shuffles(depth: int):
    def fn(x):
        n, c, h, w = x.shape
        for _ in range(depth):   # ShuffleNet's channel shuffle, then a pointwise op
            x = x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
            x = torch.relu(x) + 1
        return x
    return fn


def _largest_index(depth: int) -> tuple[int, float]:
    """(ops in the largest load index of any kernel, seconds to lower and emit C++)."""
    t0 = time.perf_counter()
    program = trace_function(shuffles(depth), (torch.randn(2, 8, 4, 4),))
    lowered, steps, _ = lower_and_schedule(program)
    kernels = [s for s in steps if isinstance(s, Kernel)]
    buffers, stored = cg._buffers(lowered.slots), cg._stored(steps, lowered.outputs)
    for k in kernels:
        kernel_source(k, buffers, stored)
    largest = 0
    for k in kernels:
        for node in k.nodes:
            rec = LoadRecorder()
            node.body.inner_fn(rec, index_vars("x", len(node.body.ranges)))
            largest = max([largest] + [sympy.count_ops(i) for _, i in rec.loads])
    return largest, time.perf_counter() - t0


def test_stacked_reshapes_keep_indices_small():
    small, _ = _largest_index(2)
    large, seconds = _largest_index(12)
    # folded, each shuffle adds a bounded amount; unfolded, 12 shuffles gave millions of ops
    assert large <= small + 12 * 8, (small, large)
    assert seconds < 20
