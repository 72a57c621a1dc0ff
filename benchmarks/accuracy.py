"""The accuracy rule: is a system's output as good as eager's, judged against a float64 run?

Following PyTorch's own compiler benchmarks (`torch._dynamo.utils.same` with `fp64_ref`), for
every floating output tensor, with `sys` the system's output, `eager` the eager output in the
same dtype and `ref` the output of the model and inputs cast to float64:

  1. shapes and dtypes must equal eager's;
  2. pass at once if `allclose(sys, eager, rtol=tol, atol=tol)`;
  3. otherwise pass iff   rmse(sys, ref) <= multiplier * rmse(eager, ref) + floor
     i.e. the system may be a few times further from the exact answer than eager is, plus a
     floor for outputs that eager gets almost exactly right: tol / 10, or where outputs are
     large 1e-6 of the reference's rms in float32 (8 units in the last place: rounding, e.g.
     channels-last convolutions of a deep ResNet, `aotc.prove.relative_floor`).

  dtype      tol     multiplier   floor (tol/10)
  float64    1e-7    2.0          1e-8
  float32    1e-4    2.0          1e-5
  float16    1e-2    3.0          1e-3
  bfloat16   1e-2    3.0          1e-3

Integer and bool outputs must equal eager's exactly. NaN where the reference has none fails.
Without a float64 reference (the float64 run failed) only rule 2 applies.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from aotc.prove import MULTIPLIER, relative_floor, rms, rmse

TOLERANCE = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 1e-2,
             torch.bfloat16: 1e-2}


def flatten(out) -> list[torch.Tensor]:
    """The tensors of a model output in a fixed order: dicts (and HF ModelOutputs, which are
    dicts of their non-None fields) by key order, dataclasses by field, sequences in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        return [t for v in out.values() for t in flatten(v)]
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return [t for f in dataclasses.fields(out) for t in flatten(getattr(out, f.name))]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in flatten(v)]
    return []


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""
    error: float | None = None         # worst rmse(system, fp64) over the outputs
    eager_error: float | None = None   # rmse(eager, fp64) on that same output


def judge(got, eager, ref=None) -> Verdict:
    """Compare a system's outputs with eager's (same dtype) and the float64 reference."""
    got, eager = flatten(got), flatten(eager)
    ref = flatten(ref) if ref is not None else [None] * len(eager)
    if len(got) != len(eager) or len(ref) != len(eager):
        return Verdict(False, f"{len(got)} output tensors, eager gives {len(eager)}")
    worst = Verdict(True)
    cpu = lambda t: None if t is None else t.detach().cpu()   # noqa: E731
    for i, (g, e, r) in enumerate(zip(got, eager, ref)):
        v = judge_tensor(cpu(g), cpu(e), cpu(r))
        if not v.ok:
            return dataclasses.replace(v, reason=f"output #{i}: {v.reason}")
        if v.error is not None and (worst.error is None or v.error > worst.error):
            worst = v
    return worst


def judge_tensor(got: torch.Tensor, eager: torch.Tensor, ref: torch.Tensor | None) -> Verdict:
    if got.shape != eager.shape or got.dtype != eager.dtype:
        return Verdict(False, f"got {got.dtype}{list(got.shape)}, eager gives "
                              f"{eager.dtype}{list(eager.shape)}")
    if not got.dtype.is_floating_point:
        return Verdict(True) if torch.equal(got, eager) else Verdict(False, "values differ")
    tol = TOLERANCE.get(got.dtype, 1e-4)
    err = None if ref is None else rmse(got, ref)
    eager_err = None if ref is None else rmse(eager, ref)
    if torch.allclose(got.double(), eager.double(), rtol=tol, atol=tol, equal_nan=True):
        return Verdict(True, error=err, eager_error=eager_err)
    if ref is None:
        return Verdict(False, f"not within {tol:g} of eager and no float64 reference")
    floor = max(tol / 10, relative_floor(got.dtype, rms(ref)))
    bound = MULTIPLIER.get(got.dtype, 2.0) * eager_err + floor
    if math.isnan(err) or err > bound:
        return Verdict(False, f"rmse vs float64 {err:.3g} > {bound:.3g} (eager's {eager_err:.3g})",
                       error=err, eager_error=eager_err)
    return Verdict(True, error=err, eager_error=eager_err)


def identical(a, b) -> bool:
    """Two eager runs gave bitwise the same outputs (NaNs in the same places count as equal)."""
    a, b = flatten(a), flatten(b)
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and bool(torch.equal(x, y) or (x.dtype.is_floating_point
                                       and torch.allclose(x, y, rtol=0, atol=0, equal_nan=True)))
        for x, y in zip(a, b))
