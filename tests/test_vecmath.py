"""The vectorizable float math of the C++ backend (codegen/cpp/vecmath.h) against float64."""
import pytest
import torch

import aotc
from aotc.api import compile_function

FUNCS = {"exp": torch.exp, "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid}
SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, -1e-30, 88.7, -103.0]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    x = torch.cat([torch.linspace(-120, 100, 100001), torch.tensor(SPECIAL)])
    fn = lambda x: tuple(f(x) for f in FUNCS.values())
    m = aotc.load(compile_function(fn, (x,), tmp_path_factory.mktemp("vm") / "vm.aotc"))
    return x, dict(zip(FUNCS, m(x)))


@pytest.mark.parametrize("name", list(FUNCS))
def test_relative_error_against_float64(results, name):
    x, got = results
    ref32, ref64 = FUNCS[name](x), FUNCS[name](x.double())
    finite = torch.isfinite(ref32) & (ref32.abs() > 1e-37)
    rel = ((got[name].double() - ref64).abs() / ref64.abs())[finite].max().item()
    assert rel < 4e-7, f"{name}: max relative error {rel:.3g}"


@pytest.mark.parametrize("name", list(FUNCS))
def test_special_values_match_torch(results, name):
    x, got = results
    n = len(SPECIAL)
    torch.testing.assert_close(got[name][-n:], FUNCS[name](x[-n:]), equal_nan=True,
                               rtol=1e-6, atol=1e-30)
