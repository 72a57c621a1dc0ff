"""Export proves its artifact: before the finished directory is swapped into place, it is
loaded with the public runtime (`aotc.load`) and run on the recorded sample inputs, and its
outputs are compared with the eager outputs recorded beside them (what `aotc verify` checks
later). A failure is a `LoweringError` naming the plan step, its op and the model's source
line where the plan failed, and no artifact is left behind.

Where the exporting machine cannot run the target (CUDA cubins cross-compiled on a CPU host),
the manifest's `export_check` says the artifact was not run and why; `aotc verify` on the
target machine is the check then. Outputs are compared with `compare`, the rule `aotc verify`
uses.
"""
from __future__ import annotations

import math
import traceback
from pathlib import Path

import torch

from aotc.errors import AotcError, LoweringError

# (rtol, atol) by dtype: what a compiled artifact may differ from eager by
TOLERANCES = {torch.float64: (1e-7, 1e-7), torch.float32: (1e-4, 1e-4),
              torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
_FIX = ("report it with the model (this is an aotc bug); meanwhile export with --no-codegen, "
        "which runs every op through ATen")


# Half-precision outputs of deep models: eager's own rounding error grows with depth (a 22-layer
# LLaMA of 1.1B parameters in bf16 is 2.1% off its fp32 run in relative L2, aotc's 2.1% too, and
# the two 2.1% apart), so elementwise tolerances refuse a correct artifact. Without explicit
# tolerances such an output also passes where its relative L2 distance to eager's is within
# this (a wrong op or layer is off by tens of percent).
HALF_RELATIVE = {torch.bfloat16: 5e-2, torch.float16: 1e-2}


def compare(got: torch.Tensor, want: torch.Tensor, rtol=None, atol=None) -> tuple[bool, float]:
    """(within tolerance, max abs difference)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, float("inf")
    if not (want.dtype.is_floating_point or want.dtype.is_complex):
        return bool(torch.equal(got.cpu(), want.cpu())), 0.0
    r, a = TOLERANCES.get(want.dtype, (1e-4, 1e-4))
    r, a = rtol if rtol is not None else r, atol if atol is not None else a
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    diff = float((g - w).abs().max()) if g.numel() else 0.0
    if torch.allclose(g, w, rtol=r, atol=a, equal_nan=True):
        return True, diff
    bound = HALF_RELATIVE.get(want.dtype) if rtol is None and atol is None else None
    if bound is None or not bool(torch.isfinite(g).eq(torch.isfinite(w)).all()):
        return False, diff
    finite = torch.isfinite(w)
    scale = float(w[finite].norm())
    return float((g[finite] - w[finite]).norm()) <= bound * scale, diff


# An output outside those tolerances still passes if it is as close to the float64 run's
# (exporter/reference.py) as eager's output is, up to MULTIPLIER, plus a floor of a tenth of
# the dtype's tolerance (the rule of torch's own compiler benchmarks, `same(fp64_ref=...)`),
# provided eager's output is itself that run's up to rounding (relative L2 within
# EAGER_RELATIVE: recorded outputs that were damaged or tampered with vouch for nothing).
# The floor is relative too where outputs are large: an rmse of RELATIVE_FLOOR times the
# reference's rms (8 units in the last place of float32) is rounding whatever eager's error
# (a 101-layer ResNet's logits of 2.5e4: eager 0.014 off float64, aotc's channels-last
# convolutions 0.028, 1.1e-6 of the values; eager itself in channels-last is 1.5x off).
MULTIPLIER = {torch.float64: 2.0, torch.float32: 2.0, torch.float16: 3.0, torch.bfloat16: 3.0}
RELATIVE_FLOOR = {torch.float64: 1e-14, torch.float32: 1e-6}
EAGER_RELATIVE = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 1e-2,
                  torch.bfloat16: 5e-2}


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return float(torch.sqrt(torch.mean((a.detach().cpu().double() - b.detach().cpu().double())
                                       ** 2)))


def rms(t: torch.Tensor) -> float:
    return float(t.detach().cpu().double().square().mean().sqrt()) if t.numel() else 0.0


def relative_floor(dtype: torch.dtype, scale: float) -> float:
    """The rmse that is rounding for outputs of dtype `dtype` whose rms is `scale`."""
    return RELATIVE_FLOOR.get(dtype, 0.0) * scale


def within_reference(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor) -> tuple[bool, str]:
    """(`got` is as close to the float64 reference `ref` as eager's `want` is, and `want` is
    `ref` up to rounding; a description of the errors). NaN where `ref` has none fails."""
    if got.shape != want.shape or got.dtype != want.dtype or ref.shape != want.shape:
        return False, "shapes differ"
    err, eager_err = rmse(got, ref), rmse(want, ref)
    scale = rms(ref)
    bound = MULTIPLIER.get(want.dtype, 2.0) * eager_err + max(
        TOLERANCES.get(want.dtype, (1e-4, 1e-4))[1] / 10, relative_floor(want.dtype, scale))
    text = f"rmse against float64 {err:.3g}, eager's {eager_err:.3g}"
    if math.isnan(eager_err) or eager_err > EAGER_RELATIVE.get(want.dtype, 1e-3) * scale:
        return False, f"{text} (eager's is more than rounding: no reference)"
    return not math.isnan(err) and err <= bound, text


def matches(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor | None,
            rtol=None, atol=None) -> tuple[bool, str]:
    """The comparison of export's proof and `aotc verify`: `compare`, else (no tolerance given,
    a float64 reference recorded) `within_reference`. (ok, what was measured)."""
    ok, diff = compare(got, want, rtol, atol)
    text = f"max abs diff {diff:.3g}"
    if ok or ref is None or rtol is not None or atol is not None or \
            not want.dtype.is_floating_point:
        return ok, text
    ok, ref_text = within_reference(got, want, ref)
    return ok, f"{text}; {ref_text}"


def artifact_check(samples, device: str, wanted: bool = True, native: dict | None = None,
                   reference: dict | None = None):
    """(the check to run on the complete temporary directory or None, the manifest's
    `export_check` record). A CPU artifact with kernels for several CPU levels is run once per
    level (the library of each level is proven, not only the one this host would pick); one
    with kernels for another architecture is not run."""
    if not wanted:
        return None, {"ran": False, "why": "turned off (--no-prove)"}
    if samples is None:
        return None, {"ran": False, "why": "no samples were recorded (--no-record-samples)"}
    if device != "cpu":
        return None, {"ran": False, "why": f"a {device} artifact is not run on the exporting "
                      "machine; run `aotc verify` on the target"}
    from aotc.artifact.isa import host_arch, supported
    levels = list((native or {}).get("libraries", {}))
    if levels and not all(supported(level) for level in levels):
        return None, {"ran": False, "why": f"kernels for {', '.join(levels)} do not run on "
                      f"this {host_arch()} host; run `aotc verify` on the target"}
    inputs, outputs = samples

    def check(tmp):
        for level in levels or [None]:
            prove(Path(tmp), inputs, outputs, level, reference)
    record = {"ran": True, "samples": len(inputs), "outputs": len(outputs)}
    return check, (dict(record, levels=levels) if levels else record)


def prove(path: Path, inputs, expected, isa: str | None = None,
          reference: dict | None = None) -> None:
    """Load the artifact at `path` (its kernels for CPU level `isa`, None: the best), run it
    on `inputs`, and compare with `expected` (and the float64 `reference` of those outputs
    that have one: `matches`)."""
    import aotc
    try:
        module = aotc.load(path, isa=isa)
    except AotcError as e:
        raise LoweringError(f"the artifact just written does not load: {e.what}",
                            where=e.where or str(path), expected="an artifact aotc.load accepts",
                            found=type(e).__name__, fix=_FIX) from e
    try:
        if getattr(module, "generation", None) is not None:
            return _prove_generation(module, inputs[0], expected[0])
        got = module.run_flat("forward", tuple(inputs))
    except Exception as e:   # noqa: BLE001 - any failure of a plan step is the finding
        if isinstance(e, AotcError) and _failed_step(e) is e:
            raise
        module, e = _on_python_runner(module, path, inputs, _failed_step(e))
        raise step_error(module, path, e) from e
    for i, (g, w) in enumerate(zip(got, expected)):
        ok, text = matches(g, w, (reference or {}).get(i))
        if not ok:
            raise LoweringError(f"the artifact's output #{i} differs from eager's on the "
                                "recorded sample inputs", where=f"output #{i}",
                                expected=f"{w.dtype}{list(w.shape)} within tolerance",
                                found=f"{g.dtype}{list(g.shape)}, {text}", fix=_FIX)


def _prove_generation(module, prompt: torch.Tensor, want: torch.Tensor) -> None:
    """A generator: its greedy tokens from the recorded prompt against eager's. In float32
    they must be equal; in half precision (any weight in float16 or bfloat16: float32 buffers
    such as rotary tables may sit beside them) a late tie may flip, so only the first token (the
    prefill's) must be."""
    got = module.generate(prompt, want.shape[1] - prompt.shape[1]).cpu()
    want = want.cpu()
    half = any(w.dtype in (torch.float16, torch.bfloat16) for w in module.weights.values())
    n = prompt.shape[1] + 1 if half else want.shape[1]
    if not torch.equal(got[:, :n], want[:, :n]):
        first = int((got[:, :n] != want[:, :n]).any(0).nonzero()[0]) - prompt.shape[1]
        raise LoweringError("the generator's greedy tokens differ from eager's on the recorded "
                            "prompt", where=f"new token {first}",
                            expected=want[:, prompt.shape[1]:n].tolist(),
                            found=got[:, prompt.shape[1]:n].tolist(), fix=_FIX)


def step_error(module, path: Path, exc: BaseException) -> LoweringError:
    """A LoweringError for an exception raised while the plan ran: the plan line it came
    from, mapped back to its step (the runtime records which step each line runs), the step's
    op and the model's source line recorded with it."""
    entry, lineno = _plan_frame(exc)
    where, found = "plan " + entry, type(exc).__name__
    fn = module.entries[entry].function if entry in module.entries else None
    if fn is not None and lineno is not None:
        lines = fn.source.splitlines()
        found = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else found
        idx = fn.line_steps.get(lineno)
        if idx is not None:
            step = fn.plan.steps[idx]
            what = getattr(step, "op", None) or getattr(step, "name", "")
            where = f"plan {entry}, step {idx} ({step.kind.value} {what})"
            if getattr(step, "source", None):
                where += f", from {step.source}"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return LoweringError(f"the exported artifact fails on the recorded sample inputs: "
                         f"{type(exc).__name__}: {reason[:300]}", where=where,
                         expected="the plan runs the samples as eager did", found=found,
                         fix=_FIX)


def _on_python_runner(module, path: Path, inputs, exc: BaseException):
    """The C++ runner reports no plan line: run the samples again on the Python runner, whose
    lines map to steps, to name the step that fails. (module, exception) to report: the
    Python runner's, or the C++ runner's own where only it fails."""
    if "cpp" not in getattr(module, "runtime", ""):
        return module, exc
    import aotc
    python = aotc.load(path, runner="python")
    try:
        if getattr(python, "generation", None) is not None:
            python.generate(inputs[0], 1)
        else:
            python.run_flat("forward", tuple(inputs))
    except Exception as again:   # noqa: BLE001 - the same failure, located
        return python, _failed_step(again)
    return module, exc


def _failed_step(exc: BaseException) -> BaseException:
    """The error a plan step raised: the runtime reports one as an ArtifactError caused by it
    (runtime/module.py `raise_plan_failure`); anything else as it is."""
    cause = exc.__cause__
    if isinstance(exc, AotcError) and cause is not None and not isinstance(cause, AotcError):
        return cause
    return exc


def _plan_frame(exc) -> tuple[str, int | None]:
    """(entry, line number) of the innermost frame in a generated plan function."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename.startswith("<aotc plan ")]
    if not frames:
        return "forward", None
    frame = frames[-1]
    return frame.filename.removeprefix("<aotc plan ").removesuffix(">"), frame.lineno
