"""Unit tests: Target.parse (codegen/target.py)."""
from __future__ import annotations

import pytest

from aotc.codegen.target import Target
from aotc.errors import UsageError


@pytest.mark.parametrize("text,device,archs", [
    ("cpu", "cpu", ()),
    ("CPU", "cpu", ()),
    (" cpu ", "cpu", ()),
    ("cuda", "cuda", ()),
    ("cuda:sm_90", "cuda", ("sm_90",)),
    ("cuda:sm_90a", "cuda", ("sm_90a",)),
    ("cuda:sm_100", "cuda", ("sm_100",)),
    ("cuda:sm_80,sm_90", "cuda", ("sm_80", "sm_90")),
    ("cuda:sm_80, sm_90", "cuda", ("sm_80", "sm_90")),
    ("CUDA:SM_80", "cuda", ("sm_80",)),
])
def test_valid_targets(text, device, archs):
    t = Target.parse(text)
    assert t == Target(device=device, archs=archs)
    assert Target.parse(str(t)) == t        # str() round-trips


@pytest.mark.parametrize("text,fragment", [
    ("", "unknown target"),
    ("tpu", "unknown target"),
    ("gpu", "unknown target"),
    ("cpu:sm_90", "unknown target"),
    ("cpu:avx2", "unknown target"),
    ("cuda:sm9", "unknown GPU architecture"),
    ("cuda:90", "unknown GPU architecture"),
    ("cuda:sm_9", "unknown GPU architecture"),
    ("cuda:sm_1000", "unknown GPU architecture"),
    ("cuda:sm_90,", "unknown GPU architecture"),
    ("cuda:sm_80;sm_90", "unknown GPU architecture"),
    ("cuda:compute_90", "unknown GPU architecture"),
    ("cuda:sm_12", "unknown GPU architecture"),     # compute 1.2: no GPU Triton compiles for
    ("cuda:sm_95", "unknown GPU architecture"),     # no such compute capability
    ("cuda:sm_80a", "unknown GPU architecture"),    # arch-specific variants from 9.0 only
])
def test_invalid_targets(text, fragment):
    with pytest.raises(UsageError) as info:
        Target.parse(text)
    assert fragment in str(info.value)
    assert info.value.where == "--target"
    assert info.value.fix


def test_str_and_json():
    t = Target.parse("cuda:sm_80,sm_90")
    assert str(t) == "cuda:sm_80,sm_90"
    assert str(Target.parse("cpu")) == "cpu"
    assert t.to_json(portable=False) == {"device": "cuda", "archs": ["sm_80", "sm_90"],
                                         "portable": False}
    assert Target.parse("cpu").to_json(portable=True) == {"device": "cpu", "archs": [],
                                                          "portable": True}


def test_target_is_immutable():
    t = Target.parse("cpu")
    with pytest.raises(AttributeError):
        t.device = "cuda"
