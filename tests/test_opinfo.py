"""OpInfo-driven numerics of the CPU code generator.

Each case is one (OpInfo, dtype) from `opinfo_cases` (which holds the selection, the dtypes, the
sample skip rules and the tolerances): all of the OpInfo's usable samples are batched into one
function, compiled once with `aotc.api.compile_function`, run, and compared output by output
with the same function run eagerly. A case passes when every output matches AND codegen did
work: some ATen op was lowered to loop IR and at least one C++ kernel was generated.

Two tables keep the suite honest:
  * XFAIL: (case, dtype) -> reason. Strict: an expected failure that passes fails the run.
  * NOT_EXERCISED: LOWERINGS ops no passing default case lowers, each with its reason.
    `test_every_lowering_is_exercised` fails when a lowering is missing from both the runs and
    the table, and when a listed op is in fact exercised (remove it from the table).

Default run: float32 for every case (int64 for integer-only ops), int64 too for the ops where
C integer semantics differ from torch's, bfloat16 for the reductions and a representative
elementwise subset. The other bfloat16 cases are @slow (`pytest -m slow tests/test_opinfo.py`).
"""
from __future__ import annotations

import pytest
import torch

import opinfo_cases as oc

f32, bf16, i64 = torch.float32, torch.bfloat16, torch.int64

# OpInfo samples include degenerate inputs on purpose (var with correction >= n, ...): their
# eager UserWarnings are expected noise here.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# ------------------------------------------------------------------------ expected failures
# (case name, dtype) -> reason. "bug: ..." names a defect outside the lowering files (reported,
# not fixed here); the other reasons are known limitations.
XFAIL: dict[tuple[str, torch.dtype], str] = {}

# ------------------------------------------------------------ lowerings no OpInfo run reaches
# (Dead lowerings, for the exporter as it stands: worth knowing when touching exporter/decomp.py.)
_DECOMPOSED = ("decomposed before lowering: in exporter/decomp.py's table (torch's core ATen "
               "decompositions), so traced graphs never contain it")
_COMPOSITE = ("CompositeImplicitAutograd: the dispatcher decomposes it before any table is "
              "consulted (reshape becomes view, or clone + _unsafe_view)")
_PY_SCALAR = ("unreachable from Python: a Python-number operand binds to the .Tensor overload "
              "(torch.add(x, 2) traces as aten.add.Tensor), so only a direct torch.ops.aten "
              "call produces it")
NOT_EXERCISED: dict[str, str] = {
    **{f"aten::{op}": _DECOMPOSED for op in (
        "_unsafe_view.default", "all.default", "all.dim", "all.dims", "arange.default",
        "arange.start", "clamp_max.default", "clamp_min.default", "fill.Scalar",
        "hardsigmoid.default", "hardswish.default", "masked_fill.Scalar", "masked_fill.Tensor",
        "mish.default", "roll.default", "rsub.Scalar", "rsub.Tensor", "silu.default",
        "softplus.default", "split.Tensor", "squeeze.default", "squeeze.dim", "sum.default",
        "t.default", "transpose.int", "unbind.int", "where.Scalar", "where.ScalarOther",
        "where.ScalarSelf")},
    "aten::reshape.default": _COMPOSITE,
    **{f"aten::{op}": _PY_SCALAR for op in (
        "add.Scalar", "sub.Scalar", "mul.Scalar", "div.Scalar", "div.Scalar_mode")},
    "aten::_native_batch_norm_legit_no_training.default":
        "produced by torch.export's pre-dispatch trace (aotc.export of a module), not by "
        "make_fx: trace_function gives eval batch_norm as aten.native_batch_norm(training="
        "False), whose lowering (exercised by nn.functional.batch_norm) calls this one's",
    "aten::mm.default":
        "lowered only for CUDA targets and a product of one row (codegen/lowering/matvec.py), "
        "which the CPU OpInfo run never builds: tests/test_matvec.py covers it through the "
        "Triton interpreter",
    "aotc::decode_attention.default":
        "aotc's own op (aotc/nn.py), in no OpInfo: tests/test_generate.py checks its CUDA "
        "kernels through the interpreter and its runtime op on the CPU",
    "aotc::decode_attention_write.default":
        "aotc's own op (aotc/nn.py), in no OpInfo: tests/test_generate.py checks its CUDA "
        "kernels through the interpreter and its runtime op on the CPU",
    "aten::cumsum.default":
        "lowered only when its input is a provable constant (a traced mask), which no OpInfo "
        "sample's input is: tests/test_constfold.py covers it, and ATen runs every OpInfo case",
}


def _aten_name(op) -> str:
    """'aten.add.Tensor' (an OpOverload's str) -> 'aten::add.Tensor' (the stats' spelling)."""
    return str(op).replace(".", "::", 1)


# ------------------------------------------------------------------------------- the cases

def _param(name, dtype, slow):
    marks = [pytest.mark.slow] if slow else []
    if (name, dtype) in XFAIL:
        marks.append(pytest.mark.xfail(reason=XFAIL[(name, dtype)], strict=True))
    return pytest.param(name, dtype, marks=marks, id=f"{name}-{oc._dt(dtype)}")


CASES = oc.all_cases()
DEFAULT_CASES = [(n, d) for n, d, slow in CASES if not slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """run(name, dtype) -> opinfo_cases.Result, computed once per session."""
    out = tmp_path_factory.mktemp("opinfo")
    cache: dict = {}

    def get(name, dtype):
        if (name, dtype) not in cache:
            cache[(name, dtype)] = oc.run_case(name, dtype, out)
        return cache[(name, dtype)]
    return get


@pytest.mark.parametrize("name,dtype", [_param(*c) for c in CASES])
def test_opinfo_numerics(run, name, dtype):
    r = run(name, dtype)
    assert r.error is None, f"{name} {oc._dt(dtype)}: {r.error}"
    assert r.lowered, (f"{name} {oc._dt(dtype)}: every op fell back to ATen "
                       f"({sorted(r.fallback)}): this case does not test codegen")
    assert r.kernels > 0, (f"{name} {oc._dt(dtype)}: ops were lowered ({sorted(r.lowered)}) "
                           "but no kernel was generated: this case does not test codegen")


def test_every_lowering_is_exercised(run):
    """Every op in LOWERINGS is lowered by at least one passing default case, or listed in
    NOT_EXERCISED with a reason (and then must not be exercised)."""
    from aotc.codegen.lowering import LOWERINGS
    from aotc.exporter.decomp import decomposition_table

    exercised: dict[str, list[str]] = {}
    for name, dtype in DEFAULT_CASES:
        r = run(name, dtype)
        if r.error is None and (name, dtype) not in XFAIL:
            for op in r.lowered:
                exercised.setdefault(op, []).append(f"{name}-{oc._dt(dtype)}")
    registered = {_aten_name(op): op for op in LOWERINGS}
    problems = []
    for key, op in sorted(registered.items()):
        if key in exercised and key in NOT_EXERCISED:
            problems.append(f"{key} is in NOT_EXERCISED but {exercised[key][0]} lowers it: "
                            "remove it from the table")
        elif key not in exercised and key not in NOT_EXERCISED:
            problems.append(f"{key} is lowered by no passing OpInfo case: add an OpInfo that "
                            "reaches it, or list it in NOT_EXERCISED with the reason")
    for key, reason in NOT_EXERCISED.items():
        if key not in registered:
            problems.append(f"NOT_EXERCISED lists {key}, which has no lowering")
        elif reason == _DECOMPOSED and registered[key] not in decomposition_table():
            problems.append(f"{key} is listed as decomposed but the decomposition table keeps "
                            "it")
        elif reason == _COMPOSITE and not torch._C._dispatch_has_kernel_for_dispatch_key(
                registered[key].name(), "CompositeImplicitAutograd"):
            problems.append(f"{key} is listed as CompositeImplicitAutograd but is not")
    assert not problems, "\n".join(problems)


def test_tables_name_real_cases():
    """XFAIL keys are cases of this file; every case's dtype is one its OpInfo supports."""
    cases = {(n, d) for n, d, _ in CASES}
    stale = [k for k in XFAIL if k not in cases]
    assert not stale, f"XFAIL entries that are not cases: {stale}"
    unsupported = [(n, oc._dt(d)) for n, d, _ in CASES
                   if d not in oc.opinfo_of(n).supported_dtypes("cpu")]
    assert not unsupported, f"cases in dtypes their OpInfo does not support: {unsupported}"
