"""CPU kernels run on as many OpenMP threads as torch is given, per calling thread."""
from __future__ import annotations

import ctypes
import threading

import torch

import aotc


def _max_threads(m) -> int:
    fn = m.library.cdll.aotc_max_threads
    fn.restype = ctypes.c_int
    return fn()


def test_kernels_follow_torch_thread_count(tmp_path):
    x = torch.randn(16, 32)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    m = aotc.load(aotc.export(model.eval(), (x,), tmp_path / "m.aotc"))
    before = torch.get_num_threads()
    try:
        for n in (1, 3, 2):
            torch.set_num_threads(n)
            torch.testing.assert_close(m(x), model(x))
            assert _max_threads(m) == n
        seen = {}

        def worker():   # another thread: its own OpenMP setting, set by its own first call
            torch.set_num_threads(1)
            m(x)
            seen["n"] = _max_threads(m)
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert seen["n"] == 1 and _max_threads(m) == 2
    finally:
        torch.set_num_threads(before)
