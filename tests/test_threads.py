"""A CompiledModule holds no per-call state: many threads may call it at once."""
from __future__ import annotations

import threading

import pytest
import torch

import aotc
from conftest import SAMPLES, assert_matches, eager

THREADS = 8
ROUNDS = 5


@pytest.mark.parametrize("name", ["mlp", "transformer", "bert"])
def test_concurrent_calls_match_eager(exported, name):
    ex = exported(name)
    m = aotc.load(ex.path)
    inputs = [SAMPLES[name].inputs(100 + i) for i in range(THREADS)]
    expected = [eager(ex.model, x) for x in inputs]
    # Different inputs must give different outputs, or a mix-up between threads would go unseen.
    first = [e if isinstance(e, torch.Tensor) else next(iter(e.values())) for e in expected]
    assert all(not torch.equal(first[0], f) for f in first[1:])

    barrier = threading.Barrier(THREADS)
    results: list = [None] * THREADS
    errors: list = []

    def worker(i):
        try:
            barrier.wait(timeout=60)
            results[i] = [m(*inputs[i]) for _ in range(ROUNDS)]
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == []
    for i in range(THREADS):
        for out in results[i]:
            assert_matches(out, expected[i])


def test_concurrent_guard_failures_and_successes(exported):
    """Half the threads pass bad inputs; their GuardErrors never affect the other half."""
    ex = exported("mlp")
    m = aotc.load(ex.path)
    good = [torch.randn(32, 64) for _ in range(THREADS // 2)]
    expected = [eager(ex.model, (x,)) for x in good]
    barrier = threading.Barrier(THREADS)
    outcome: dict = {}

    def ok(i):
        barrier.wait(timeout=60)
        outcome[("ok", i)] = [m(good[i]) for _ in range(ROUNDS)]

    def bad(i):
        barrier.wait(timeout=60)
        caught = 0
        for _ in range(ROUNDS):
            try:
                m(torch.randn(32, 60 + i))
            except aotc.GuardError as e:
                caught += f"size {60 + i}" in str(e)
        outcome[("bad", i)] = caught

    threads = [threading.Thread(target=ok, args=(i,)) for i in range(THREADS // 2)]
    threads += [threading.Thread(target=bad, args=(i,)) for i in range(THREADS // 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i in range(THREADS // 2):
        assert outcome[("bad", i)] == ROUNDS
        for out in outcome[("ok", i)]:
            assert_matches(out, expected[i])


def test_parallel_from_the_work_per_element_not_the_size_alone():
    """64 x 256 is below the element threshold, but a layer norm, GELU and softmax over it
    do tens of operations per element: that kernel runs on threads; a plain add over the same
    size does not."""
    import torch.nn.functional as F
    from aotc.codegen import lower_and_schedule
    from aotc.codegen.cpp.work import PARALLEL_MIN_ELEMENTS, worth_threads
    from aotc.codegen.scheduler import Kernel
    from aotc.exporter import trace_function

    def kernels(fn, *args):
        _, steps, _ = lower_and_schedule(trace_function(fn, args))
        return [s for s in steps if isinstance(s, Kernel)]
    x, w = torch.randn(64, 256), torch.ones(256)
    assert 64 * 256 < PARALLEL_MIN_ELEMENTS
    heavy = kernels(lambda x: torch.softmax(F.gelu(F.layer_norm(x, (256,), w)) * 2, -1), x)
    assert heavy and all(worth_threads(k) for k in heavy)
    light = kernels(lambda x: x + 1, x)
    assert light and not any(worth_threads(k) for k in light)
