"""OpInfo cases for the CPU code generator's numerics tests (tests/test_opinfo.py).

One *case* is one (OpInfo, dtype): every usable sample of the OpInfo is batched into ONE plain
tensor function (Python scalars, lists and dtypes of the samples are closed over; only tensors
become inputs) that returns all outputs of all samples as one flat tuple. The function is compiled
once with `aotc.api.compile_function` (g++ is the slow part, so one artifact per case), run on
the samples' tensors, and compared with the same function run eagerly.

Everything that decides what is tested lives here: the OpInfo selection (`GROUPS`), the dtypes
(`dtypes_for`), the samples (`batch`: sample_inputs, or reference_inputs for the elementwise
groups, plus EXTRA_SAMPLES), the skip rules (one block, "skip rules") and the tolerances
(`tolerance`, TOLERANCE_OVERRIDES).
"""
from __future__ import annotations

import functools
import json
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

f32, bf16, i64, b8 = torch.float32, torch.bfloat16, torch.int64, torch.bool

# ------------------------------------------------------------------------------ selection
# OpInfo full names ("name" or "name.variant_test_name"), by group. Every group runs in float32
# (or, for integer/bool-only ops, in the OpInfo's first supported integer dtype); see
# `dtypes_for` for the extra dtypes.
GROUPS: dict[str, tuple[str, ...]] = {
    "unary": (
        "neg", "abs", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt",
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
        "tanh", "sigmoid", "erf", "floor", "ceil", "round", "trunc", "reciprocal", "sign",
        "signbit", "isnan", "isinf", "logical_not", "bitwise_not",
    ),
    "binary": (
        "add", "sub", "rsub", "mul", "div.no_rounding_mode", "div.trunc_rounding",
        "div.floor_rounding", "true_divide", "floor_divide", "pow", "maximum", "minimum",
        "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
        "bitwise_and", "bitwise_or", "bitwise_xor", "remainder", "fmod", "atan2", "copysign",
        "hypot",
    ),
    "ternary": ("where", "clamp", "clamp_min", "clamp_max", "masked_fill"),
    "activation": (
        "nn.functional.gelu", "nn.functional.silu", "nn.functional.relu",
        "nn.functional.leaky_relu", "nn.functional.hardsigmoid", "nn.functional.hardswish",
        "nn.functional.elu", "nn.functional.softplus", "nn.functional.mish",
        "nn.functional.hardtanh",
    ),
    "reduction": (
        "sum", "mean", "amax", "amin", "prod", "var", "var.unbiased", "var_mean",
        "var_mean.unbiased", "argmax", "argmin", "any", "all", "softmax", "softmax.with_dtype",
        "log_softmax", "log_softmax.with_dtype", "nn.functional.layer_norm",
        "nn.functional.batch_norm",
    ),
    "view": (
        "view", "reshape", "permute", "transpose", "t", "expand", "narrow", "select", "squeeze",
        "squeeze.multiple", "unsqueeze", "split", "split.list_args", "unbind", "cat",
        "nn.functional.pad.constant", "flip", "roll", "clone", "contiguous", "to",
    ),
    "indexing": ("nn.functional.embedding", "gather", "index_select", "__getitem__",
                 "__getitem__!raw_list_index"),
    "pooling": ("nn.functional.max_pool2d", "nn.functional.avg_pool2d",
                "nn.functional.adaptive_avg_pool2d"),
    "creation": ("arange", "full", "zeros", "ones", "scalar_tensor", "full_like", "zeros_like",
                 "ones_like"),
    # lowered as an `mm` extern plus the bias add kept for the consuming kernel
    "matmul": ("nn.functional.linear",),   # addmm's own samples use 2-d biases or beta, alpha
}

# Elementwise OpInfos' sample_inputs are thin (one to three random tensors for most unary ops):
# these groups use reference_inputs instead, a superset that adds small, large and extremal
# (nan, inf, -0.0) values, Python-scalar operands with type promotion, broadcasting and
# non-contiguous inputs.
REFERENCE_INPUT_GROUPS = ("unary", "binary", "ternary", "activation")

# Integer arithmetic is where C semantics differ most from torch's (division rounding, modulo
# sign, overflowing powers, promotion): these also run in int64, compared exactly.
INT64_TOO = frozenset({
    "neg", "abs", "sigmoid", "add", "sub", "mul", "div.no_rounding_mode", "div.trunc_rounding",
    "div.floor_rounding", "floor_divide", "pow", "maximum", "minimum", "remainder", "fmod", "eq",
    "clamp", "where", "sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all", "gather",
    "cat", "arange",
})
# bfloat16 runs for every case that has a float32 run. By default: the reduction group and a
# representative subset of the elementwise groups (transcendental, rounding, division and
# modulo, comparison, select/clamp and activation ops); the rest of the elementwise groups and
# the view, indexing, pooling and creation groups run bfloat16 only under -m slow.
BF16_DEFAULT_GROUPS = ("reduction",)
BF16_DEFAULT = frozenset({
    "exp", "log", "sqrt", "tanh", "sigmoid", "erf", "round", "reciprocal", "add", "sub", "mul",
    "div.no_rounding_mode", "div.trunc_rounding", "div.floor_rounding", "pow", "maximum",
    "minimum", "eq", "remainder", "fmod", "atan2", "where", "clamp", "masked_fill",
    "nn.functional.gelu", "nn.functional.silu", "nn.functional.softplus",
    "nn.functional.leaky_relu", "nn.functional.hardswish", "nn.functional.elu",
})
# Hand-written samples appended to an OpInfo's own, for semantics its generators never probe:
# case name -> fn(dtype) -> [SampleInput].
def _floor_division_edges(dtype, **kwargs):
    from torch.testing._internal.opinfo.core import SampleInput
    if not dtype.is_floating_point:
        return []
    # quotients that round up to an integer in floating point (1 / 0.1f == 10.0f, but
    # 1 // 0.1 == 9), signed zeros, division by zero, huge and tiny operands
    a = torch.tensor([1., -1., 1., .3, -.3, 7.5, 5., 0., -0., 1e-30, 3e38, -3e38, 1., -7.],
                     dtype=dtype)
    b = torch.tensor([.1, .1, -.1, .1, -.1, -2., 0., 3., 3., 1e30, .3, 7., 3., 0.],
                     dtype=dtype)
    return [SampleInput(a, args=(b,), kwargs=kwargs)]


EXTRA_SAMPLES = {
    "div.floor_rounding": lambda dtype: _floor_division_edges(dtype, rounding_mode="floor"),
    "floor_divide": _floor_division_edges,
}

# A view returned as a graph output is replayed as an ATen view step, never read by a kernel:
# these groups also return a clone of every output, which a kernel computes through the view's
# index remap (the lowering under test).
MATERIALIZE_GROUPS = ("view",)


def opinfo_of(name: str):
    return opinfos()[VARIANTS.get(name, name)]


def full_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.lru_cache(maxsize=None)
def opinfos() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db
    return {full_name(op): op for op in op_db}


def group_of(name: str) -> str:
    name = VARIANTS.get(name, name)
    return next(g for g, names in GROUPS.items() if name in names)


# Ops with no floating-point dtypes: their primary dtype is int64.
INTEGER_ONLY = frozenset({"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor"})


# lowered in float32 only: in half precision linear stays ATen's addmm (one rounding of the
# product plus bias), so a bfloat16 case would test no generated code
FLOAT32_ONLY = frozenset({"nn.functional.linear"})


def dtypes_for(name: str) -> list[tuple[torch.dtype, bool]]:
    """[(dtype, slow)] for one case: float32 (int64 for INTEGER_ONLY), plus int64 for INT64_TOO,
    plus bfloat16 (slow outside BF16_DEFAULT and BF16_DEFAULT_GROUPS). A table, not op_db:
    collecting the tests must not import op_db; `test_tables_name_real_cases` checks it
    against the OpInfos' supported dtypes."""
    if name in VARIANTS or name in FLOAT32_ONLY:
        return [(f32, False)]
    if name in INTEGER_ONLY:
        return [(i64, False)]
    out = [(f32, False)]
    if name in INT64_TOO:
        out.append((i64, False))
    out.append((bf16, name not in BF16_DEFAULT and group_of(name) not in BF16_DEFAULT_GROUPS))
    return out


def all_cases() -> list[tuple[str, torch.dtype, bool]]:
    return [(name, dtype, slow) for names in GROUPS.values() for name in names
            for dtype, slow in dtypes_for(name)]


# ------------------------------------------------------------------------------ tolerances

# (case, dtype of the case) -> tolerances replacing `tolerance(output dtype)`, with the reason.
TOLERANCE_OVERRIDES: dict[tuple[str, torch.dtype], tuple[dict, str]] = {
    ("log_softmax", bf16): (dict(rtol=1.6e-2, atol=1.6e-2),
                            "eager's bf16 log_softmax rounds x - max - logsumexp through bf16 "
                            "(abs error up to ~4e-3 near 0, where rtol cannot help); aotc keeps "
                            "it in fp32 and is closer to the fp64 result"),
}


def tolerance(dtype: torch.dtype, case: tuple | None = None) -> dict:
    """assert_close tolerances: fp32 10x torch's default rtol, bf16 torch's defaults; integer
    and bool results exact. NaNs must match NaNs."""
    if case in TOLERANCE_OVERRIDES and (dtype.is_floating_point or dtype.is_complex):
        return TOLERANCE_OVERRIDES[case][0]
    if dtype == torch.float32:
        return dict(rtol=1.3e-5, atol=1e-5)
    if dtype == torch.float64:
        return dict(rtol=1e-7, atol=1e-7)
    if dtype in (torch.bfloat16, torch.float16):
        return dict(rtol=1.6e-2, atol=1e-5)
    return dict(rtol=0, atol=0)


# ------------------------------------------------------------------------------ skip rules
# A case batches at most this many samples (nn.functional.max_pool2d has 1440: tracing and
# compiling them all takes a minute); the rest are skipped, evenly spaced.
MAX_SAMPLES = 48


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


# The skip rules, all of them: `skip_reason` (before running the sample) and
# `_eager_skip_reason` (after running it eagerly). A skipped sample is counted by its reason in
# the case's Result. Empty (zero-size) tensors are NOT skipped: they trace and compile.
#   * an input that is not a strided CPU tensor, or is complex (aotc's CPU codegen is real-only)
#   * nn.functional.batch_norm with training=True (mutates running stats; aotc exports eval)
#   * __getitem__ with a boolean mask (data-dependent output shape)
#   * narrow with a tensor `start` (read with .item() while tracing: data-dependent)
#   * RAW_GETITEM: samples without a list index (that case exists only for list indices)
#   * the sample raises eagerly (invalid argument combinations some generators produce)
#   * an output that is not a tensor, or not a real strided one
#   * the sample mutates its inputs (e.g. embedding with max_norm renormalizes the weight)
#   * over MAX_SAMPLES usable samples: an evenly spaced subset is kept


def skip_reason(name: str, sample, dtype) -> str | None:
    """Why a sample is not batched into the case (checked before running it), or None."""
    ins = _tensors((sample.input, sample.args, sample.kwargs))
    for t in ins:
        if t.layout != torch.strided or t.device.type != "cpu":
            return "input is not a strided CPU tensor"
        if t.is_complex():
            return "complex input"
    if name == "nn.functional.batch_norm" and sample.kwargs.get("training", False):
        return "batch_norm in training mode (mutates running stats; aotc exports eval only)"
    if name.startswith("__getitem__") and any(t.dtype == torch.bool for t in ins):
        return "boolean-mask indexing (data-dependent output shape)"
    if name == "narrow" and isinstance(sample.args[1], torch.Tensor):
        return "narrow with a tensor start (read with .item() while tracing: data-dependent)"
    if name == RAW_GETITEM and not _has_list_index(sample.args[0]):
        return "no list index (the raw __getitem__ case only runs list-index samples)"
    return None


def _eager_skip_reason(ins_before, ins_after, out) -> str | None:
    """Why a sample that ran eagerly (inputs before/after, output) is not batched, or None."""
    leaves = tree_flatten(out)[0]
    if not leaves or any(not isinstance(x, torch.Tensor) for x in leaves):
        return "non-tensor output"
    for t in leaves:
        if t.layout != torch.strided or t.is_complex():
            return "output is not a real strided tensor"
    if any(not torch.equal(a, b) and not (a.is_floating_point() and torch.equal(
            a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan()))
           for a, b in zip(ins_before, ins_after)):
        return "sample mutates its inputs"
    return None


# Case names are OpInfo full names, plus this one variant. `__getitem__` samples index with
# Python lists of ints (x[[0, 2]]): the "__getitem__" case passes each such list as an int64
# tensor INPUT (same indexing semantics; it exercises aten.index.Tensor's lowering with a
# runtime index). RAW_GETITEM runs those samples unchanged: make_fx traces each list as a
# tensor constant, which `trace_function` lifts into the program's weights.
RAW_GETITEM = "__getitem__!raw_list_index"
VARIANTS = {RAW_GETITEM: "__getitem__"}


def _has_list_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, list) for p in parts)


def _lists_to_tensors(index):
    """A __getitem__ index with every list of ints replaced by an int64 tensor."""
    if isinstance(index, list):
        return torch.tensor(index, dtype=torch.int64)
    if isinstance(index, tuple):
        return tuple(_lists_to_tensors(p) for p in index)
    return index


# ------------------------------------------------------------------------------ one case

@dataclass
class Batched:
    """The samples of one case, batched into one function."""
    name: str
    dtype: torch.dtype
    fn: object                          # (*tensors) -> flat tuple of tensors
    inputs: tuple
    outputs_of: list                    # per kept sample: (description, first out, n outs)
    skipped: Counter = field(default_factory=Counter)
    total: int = 0                      # samples the OpInfo generated
    kept: int = 0                       # samples batched


def _describe(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"T{list(x.shape)}:{str(x.dtype).removeprefix('torch.')}"
        if isinstance(x, (list, tuple)):
            inner = ", ".join(d(v) for v in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}={d(v)}" for k, v in x.items()) + "}"
        return repr(x)
    return f"{d(sample.input)}, args={d(tuple(sample.args))}, kwargs={d(sample.kwargs)}"


def seed_for(name: str, dtype) -> int:
    return zlib.crc32(f"{name}/{dtype}".encode())


def _usable_samples(name: str, op, dtype: torch.dtype, skipped: Counter) -> tuple[list, int]:
    """(the OpInfo samples of `name` the batch takes, capped and with aotc's extra ones; how
    many OpInfo gave): the ones left out are counted in `skipped` by reason."""
    torch.manual_seed(seed_for(name, dtype))
    if group_of(name) in REFERENCE_INPUT_GROUPS and op.reference_inputs_func is not None:
        samples = list(op.reference_inputs("cpu", dtype, requires_grad=False))
    else:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
    usable = []
    for sample in samples:
        reason = skip_reason(name, sample, dtype)
        if reason is None:
            usable.append(sample)
        else:
            skipped[reason] += 1
    if len(usable) > MAX_SAMPLES:   # evenly spaced, so every region of the sample list stays
        chosen = {round(i * (len(usable) - 1) / (MAX_SAMPLES - 1)) for i in range(MAX_SAMPLES)}
        skipped[f"over the per-case cap of {MAX_SAMPLES} samples"] += len(usable) - len(chosen)
        usable = [u for i, u in enumerate(usable) if i in chosen]
    usable += EXTRA_SAMPLES[name](dtype) if name in EXTRA_SAMPLES else []
    return usable, len(samples)


def batch(name: str, dtype: torch.dtype) -> Batched:
    op = opinfo_of(name)
    kept, skipped = [], Counter()
    usable, total = _usable_samples(name, op, dtype, skipped)
    for sample in usable:
        args = tuple(sample.args)
        if name == "__getitem__":
            args = (_lists_to_tensors(args[0]),) + args[1:]
        leaves, spec = tree_flatten((sample.input, args, dict(sample.kwargs)))
        ins = [x for x in leaves if isinstance(x, torch.Tensor)]
        before = [t.clone() for t in ins]
        try:
            a, args, kwargs = _rebuild(leaves, spec, ins)
            with torch.no_grad():
                out = op.op(a, *args, **kwargs)
            reason = _eager_skip_reason(before, ins, out)
        except Exception as e:   # noqa: BLE001 - invalid sample combinations raise eagerly
            reason = f"eager raises ({type(e).__name__})"
        if reason is not None:
            skipped[reason] += 1
            continue
        # the sample's own tensors (not clones: a clone would lose non-contiguous strides)
        kept.append((sample, leaves, spec, ins, len(tree_flatten(out)[0])))

    inputs, layout, outputs_of, first = [], [], [], 0
    for sample, leaves, spec, ins, nout in kept:
        layout.append((leaves, spec, len(inputs), len(ins)))
        inputs += ins
        outputs_of.append((_describe(sample), first, nout))
        first += nout
    if group_of(name) in MATERIALIZE_GROUPS:   # the clones follow all the views, in order
        outputs_of += [(desc + " (cloned)", first + k, n) for desc, k, n in outputs_of]

    copy = group_of(name) in MATERIALIZE_GROUPS

    def fn(*tensors):
        outs = []
        for leaves, spec, start, n in layout:
            a, args, kwargs = _rebuild(leaves, spec, list(tensors[start:start + n]))
            outs += tree_flatten(op.op(a, *args, **kwargs))[0]
        if copy:   # a kernel must read each view through its index remap
            outs += [t.clone() for t in outs]
        return tuple(outs)
    fn.__name__ = name.replace(".", "_").replace("!", "_")
    return Batched(name, dtype, fn, tuple(inputs), outputs_of, skipped, total, len(kept))


def once_per_call(fn):
    """`fn`, but a repeated call with the very same argument objects returns the first call's
    result. Works around `exporter.trace_function`, which calls the function once per output
    (`flat_fn` re-runs `fn(*a)` for every output path), so tracing a case with N outputs would
    trace every op N times (a 100-output case: minutes instead of a second)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    last: dict = {}

    def call(*tensors):   # (make_fx traces real tensors: the key includes the tracing mode)
        mode = get_proxy_mode()
        key = (tuple(map(id, tensors)), id(mode), mode is None)
        if last.get("key") != key:
            last.update(key=key, keep=(tensors, mode), out=fn(*tensors))
        return last["out"]
    call.__name__ = fn.__name__
    return call


def _rebuild(leaves, spec, tensors):
    it = iter(tensors)
    return tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


# ------------------------------------------------------------------------------ running

@dataclass
class Result:
    name: str
    dtype: torch.dtype
    samples: int = 0                    # samples compared
    skipped: Counter = field(default_factory=Counter)
    lowered: dict = field(default_factory=dict)
    fallback: dict = field(default_factory=dict)
    kernels: int = 0
    error: str | None = None            # None: every output matched eager
    seconds: float = 0.0


def run_case(name: str, dtype: torch.dtype, out_dir: Path) -> Result:
    """Compile and compare one case. Never raises for codegen problems: they are `error`."""
    import aotc
    from aotc.api import compile_function

    t0 = time.perf_counter()
    b = batch(name, dtype)
    res = Result(name, dtype, samples=b.kept, skipped=b.skipped)
    if not b.kept:
        res.error = f"no usable samples (skipped: {dict(b.skipped)})"
        return res
    try:
        path = compile_function(once_per_call(b.fn), b.inputs,
                                out_dir / f"{b.fn.__name__}_{_dt(dtype)}.aotc")
        stats = json.loads((Path(path) / "manifest.json").read_text())["entries"]["forward"][
            "stats"]
        res.lowered, res.fallback, res.kernels = stats["lowered"], stats["fallback"], \
            stats["kernels"]
        got = aotc.load(path)(*b.inputs)
    except Exception as e:   # noqa: BLE001 - reported as the case's failure
        res.error = f"compile/run failed: {type(e).__name__}: {str(e)[:2000]}"
        res.seconds = time.perf_counter() - t0
        return res
    with torch.no_grad():
        want = b.fn(*b.inputs)
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    problems = []
    if len(got) != len(want):
        problems.append(f"{len(got)} outputs, eager has {len(want)}")
    else:
        for desc, first, n in b.outputs_of:
            for k in range(first, first + n):
                msg = compare(got[k], want[k], (name, dtype))
                if msg:
                    problems.append(f"sample {desc} output {k - first}: {msg}")
    if problems:
        res.error = f"{len(problems)} mismatching outputs:\n  " + "\n  ".join(problems[:8])
    res.seconds = time.perf_counter() - t0
    return res


def compare(got, want, case=None) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} != eager {want.dtype}{list(want.shape)}"
    try:
        torch.testing.assert_close(got, want, equal_nan=True, **tolerance(want.dtype, case))
    except AssertionError as e:
        return " ".join(str(e).split())[:400]
    return None


def _dt(dtype) -> str:
    return str(dtype).removeprefix("torch.")
