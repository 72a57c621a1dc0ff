"""Runtime guards: every kind of bad input is a GuardError that names the input, the dim, the
expected and the given value; the module keeps working afterwards."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.errors import GuardError
from conftest import SAMPLES, assert_matches, eager


@pytest.fixture(scope="module")
def mlp(exported):
    ex = exported("mlp")
    return ex, aotc.load(ex.path)


@pytest.fixture(scope="module")
def bert(exported):
    ex = exported("bert")
    return ex, aotc.load(ex.path)


def _still_works(ex, m):
    inputs = SAMPLES[ex.name].inputs(11)
    assert_matches(m(*inputs), eager(ex.model, inputs))


def _raises(m, *args) -> GuardError:
    with pytest.raises(GuardError) as info:
        m(*args)
    assert info.value.exit_code == 6
    assert isinstance(info.value, ValueError)   # GuardError is also a ValueError
    return info.value


def test_wrong_rank(mlp):
    ex, m = mlp
    e = _raises(m, torch.randn(32, 64, 1))
    msg = str(e)
    assert "'x'" in msg and "rank 3" in msg and "2" in msg
    assert "'x'" in e.where
    assert "rank 2" in str(e.expected) and "rank 3" in str(e.found)
    assert "[32, 64, 1]" in str(e.found)
    _still_works(ex, m)


@pytest.mark.parametrize("shape,dim,want,given", [((32, 65), 1, 64, 65), ((33, 64), 0, 32, 33),
                                                  ((1, 64), 0, 32, 1)])
def test_wrong_size(mlp, shape, dim, want, given):
    ex, m = mlp
    e = _raises(m, torch.randn(*shape))
    msg = str(e)
    assert f"input 'x' (#0) dim {dim} has size {given}, expected {want}" in msg
    assert e.where == f"input 'x' (#0), dim {dim}"
    assert e.expected == want and e.found == given
    _still_works(ex, m)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int64])
def test_wrong_dtype(mlp, dtype):
    ex, m = mlp
    e = _raises(m, torch.zeros(32, 64, dtype=dtype))
    assert "'x'" in str(e) and "'x'" in e.where
    assert e.expected == torch.float32 and e.found == dtype
    assert "float32" in str(e) and str(dtype) in str(e)
    _still_works(ex, m)


def test_wrong_dtype_integer_input(bert):
    ex, m = bert
    e = _raises(m, torch.zeros(2, 32, dtype=torch.int32))
    assert "'input_ids'" in str(e)
    assert e.expected == torch.int64 and e.found == torch.int32
    _still_works(ex, m)


def test_wrong_device(mlp):
    ex, m = mlp
    e = _raises(m, torch.randn(32, 64, device="meta"))
    assert "'x'" in str(e) and "'x'" in e.where
    assert e.expected == "cpu" and e.found == "meta"
    assert "meta" in str(e) and "cpu" in str(e)
    _still_works(ex, m)


@pytest.mark.parametrize("count", [0, 2, 3])
def test_wrong_input_count(mlp, count):
    ex, m = mlp
    e = _raises(m, *[torch.randn(32, 64)] * count)
    msg = str(e)
    assert f"expected 1, got {count}" in msg
    assert "x" in str(e.expected)                   # names the inputs it wants
    assert e.found == count
    _still_works(ex, m)


@pytest.mark.parametrize("value", [[[0.0] * 64] * 32, 3.0, None, "x"])
def test_non_tensor_input(mlp, value):
    ex, m = mlp
    e = _raises(m, value)
    assert "'x'" in str(e) and "not a tensor" in str(e)
    assert e.found == type(value).__name__
    assert "float32[32, 64]" in str(e.expected)
    _still_works(ex, m)


def test_run_flat_checks_guards_too(mlp):
    ex, m = mlp
    with pytest.raises(GuardError, match="dim 1 has size 63"):
        m.run_flat("forward", (torch.randn(32, 63),))
    _still_works(ex, m)


def test_error_in_one_call_does_not_poison_later_calls(mlp):
    """Interleave bad and good calls: every good call still matches eager."""
    ex, m = mlp
    bad = [torch.randn(32, 63), torch.randn(32, 64, dtype=torch.float64), "nope"]
    for i, b in enumerate(bad):
        with pytest.raises(GuardError):
            m(b)
        x = torch.randn(32, 64)
        assert_matches(m(x), eager(ex.model, (x,)))


def test_guards_off_skips_checks(exported, monkeypatch):
    """check_guards=False really turns them off: the guard checker is never consulted."""
    from aotc.runtime.guards import Guards
    ex = exported("mlp")
    m = aotc.load(ex.path, check_guards=False)

    def forbidden(self, *args, **kwargs):
        raise AssertionError("guards checked although check_guards=False")
    monkeypatch.setattr(Guards, "check", forbidden)
    x = torch.randn(32, 64)
    assert_matches(m(x), eager(ex.model, (x,)))
    with pytest.raises(AssertionError, match="guards checked"):   # control: the patch bites
        aotc.load(ex.path, runner="python")(x)   # (the C++ runner's: test_cpp_runner.py)
