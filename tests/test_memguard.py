"""The interpreter's memory bounds (runtime/memguard.py), unit by unit: which addresses a launch
may touch, and that a refused access never reaches Triton's library."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from aotc.errors import ArtifactError
from aotc.runtime.memguard import Regions, _Bounded


def _addresses(t: torch.Tensor, offsets) -> np.ndarray:
    return np.array([t.data_ptr() + o * t.element_size() for o in offsets], dtype=np.uint64)


def test_addresses_inside_a_tensor_pass_and_one_past_its_end_is_refused():
    a = torch.zeros(16)
    r = Regions("k", [a, 3])
    r.check(_addresses(a, range(16)), None, 4, "reads")
    with pytest.raises(ArtifactError, match="reads memory outside") as e:
        r.check(_addresses(a, [0, 16]), None, 4, "reads")
    assert e.value.where == "kernels/k.py" and "1 of 2 addresses" in e.value.found


def test_the_last_element_must_fit_whole():
    a = torch.zeros(4, dtype=torch.uint8)
    r = Regions("k", [a])
    r.check(_addresses(a, [0]), None, 4, "reads")
    with pytest.raises(ArtifactError):
        r.check(_addresses(a, [1]), None, 4, "reads")


def test_masked_off_lanes_are_not_checked():
    a = torch.zeros(8)
    r = Regions("k", [a])
    ptrs = _addresses(a, [0, 1, 1 << 40])
    r.check(ptrs, np.array([True, True, False]), 4, "writes")
    with pytest.raises(ArtifactError, match="writes"):
        r.check(ptrs, np.array([True, True, True]), 4, "writes")


def test_addresses_below_a_tensor_and_wrapping_around_are_refused():
    a = torch.zeros(8)
    r = Regions("k", [a])
    below = np.array([a.data_ptr() - 4], dtype=np.uint64)
    top = np.array([np.iinfo(np.uint64).max - 1], dtype=np.uint64)
    negative = np.array([-8], dtype=np.int64)
    for ptrs in (below, top, negative):
        with pytest.raises(ArtifactError):
            r.check(ptrs, None, 4, "reads")


def test_a_view_reaches_to_its_storage_end_but_not_before_its_start():
    base = torch.zeros(32)
    view = base[8:12]
    r = Regions("k", [view])
    r.check(_addresses(view, [0, 23]), None, 4, "reads")     # room to the storage's end
    with pytest.raises(ArtifactError):
        r.check(_addresses(view, [-1]), None, 4, "reads")
    with pytest.raises(ArtifactError):
        r.check(_addresses(view, [24]), None, 4, "reads")


def test_addresses_across_several_tensors_each_inside_one_pass():
    a, b, c = torch.zeros(8), torch.zeros(3, dtype=torch.float64), torch.zeros(0)
    r = Regions("k", [b, a, c, 7])
    ptrs = np.concatenate([_addresses(a, [7, 0]), _addresses(b, [2])])
    r.check(ptrs, None, 4, "reads")
    gap = np.array([min(a.data_ptr(), b.data_ptr()) - 64], dtype=np.uint64)
    with pytest.raises(ArtifactError):
        r.check(np.concatenate([ptrs, gap]), None, 4, "reads")


def test_a_launch_without_tensors_touches_nothing():
    r = Regions("k", [1, 2.0])
    r.check(np.zeros(0, dtype=np.uint64), None, 4, "reads")
    with pytest.raises(ArtifactError):
        r.check(np.array([4096], dtype=np.uint64), None, 4, "reads")


class _Library:
    """Stands in for Triton's interpreter library: records what reaches it."""

    def __init__(self):
        self.calls = []

    def load(self, *args):
        self.calls.append("load")
        return "loaded"

    def store(self, *args):
        self.calls.append("store")

    def atomic_rmw(self, *args):
        self.calls.append("rmw")

    def atomic_cas(self, *args):
        self.calls.append("cas")


def test_refused_accesses_never_reach_the_library():
    a = torch.zeros(4)
    lib = _Library()
    bounded = _Bounded(lib, Regions("k", [a]))
    good, bad = _addresses(a, [0, 3]), _addresses(a, [0, 4])
    yes = np.ones(2, dtype=bool)
    values = np.zeros(2, dtype=np.float32)
    assert bounded.load(good, yes, values, np.float32) == "loaded"
    bounded.store(good, values, yes)
    bounded.atomic_rmw(0, good, values, yes, 0)
    bounded.atomic_cas(good, values, values, 0)
    assert lib.calls == ["load", "store", "rmw", "cas"]
    for call in (lambda: bounded.load(bad, yes, values, np.float32),
                 lambda: bounded.store(bad, values, yes),
                 lambda: bounded.atomic_rmw(0, bad, values, yes, 0),
                 lambda: bounded.atomic_cas(bad, values, values, 0)):
        with pytest.raises(ArtifactError):
            call()
    assert lib.calls == ["load", "store", "rmw", "cas"]
