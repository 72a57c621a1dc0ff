"""Plan -> the C++ plan runner (runtime/cpp), for CPU and CUDA plans.

The runner is aotc's own C++ extension (`aotc.runtime._runner`), built at install time against
the installed torch (setup.py); it is part of aotc, not of any artifact, so artifacts stay
portable. A plan the schema has parsed and checked is turned here into a spec of plain tuples:
slots by number, size expressions as postfix bytecode over the call's symbols, ATen ops by
name with their arguments tagged, kernels by the address the library's own table gave for
them (checked against the plan, runtime/native.py). The runner checks the spec again, resolves
each op once against the dispatcher's schema, and runs calls with no Python in between: the
per-step cost of the Python runner (one interpreted line, ~1 us, per step) goes.

Where the runner is missing (no compiler or no torch at install time, or a build against
another torch), or a plan holds something it does not run, the Python runner (executor.py) runs
the plan instead and `runner_status` / `CompiledModule.runtime` say why.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from aotc.errors import ArtifactError
from aotc.runtime.argcheck import check_call
from aotc.runtime.executor import (FlagDeferral, bound_tensors, check_flag, resolve_op,
                                   size_error, symbol_names)
from aotc.runtime.folding import foldable, kernel_foldable
from aotc.runtime.indices import index_error
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.plan import SlotRef, SymArg, Tagged
from aotc.artifact.schema.types import SlotKind, StepKind

RUNNERS = ("cpp", "python")
_OPS = {"+": 3, "-": 4, "*": 5, "//": 6, "%": 7, "==": 10, "!=": 11, "<": 12, "<=": 13,
        ">": 14, ">=": 15, "and": 16, "or": 17}


@lru_cache(maxsize=1)
def runner_status() -> tuple[object | None, str]:
    """(the extension module, "") where the C++ runner can run here, else (None, why not)."""
    import importlib.util
    if importlib.util.find_spec("aotc.runtime._runner") is None:
        return None, ("aotc was installed without its C++ runner (it builds at install time "
                      "with torch importable: pip install --no-build-isolation .)")
    try:
        from aotc.runtime import _runner
    except ImportError as e:
        return None, f"the C++ runner does not load with this torch: {str(e)[:200]}"
    if _runner.TORCH_VERSION != torch.__version__:
        return None, (f"the C++ runner was built against torch {_runner.TORCH_VERSION}, this is "
                      f"torch {torch.__version__} (reinstall aotc to rebuild it)")
    return _runner, ""


class CppPlanFunction:
    """A plan run by the C++ runner: `fn(inputs, symbols) -> tuple of outputs`, as
    executor.PlanFunction."""

    def __init__(self, plan, weights: dict[str, torch.Tensor], device: torch.device,
                 library=None, *, static_weights: bool = True, state: dict | None = None):
        runner, why = runner_status()
        if runner is None:
            raise RuntimeError(why)
        self.plan, self.library, self.device = plan, library, device
        self._python_source = (weights, static_weights, state)
        self.deferral = FlagDeferral()
        self._spec = _Spec(plan, weights, device, library, static_weights, state or {})
        self.symbols = self._spec.given
        self._build(runner)

    def _build(self, runner) -> None:
        try:
            self.program = runner.Program(self._spec.as_dict())
        except runner.SpecError as e:
            raise ArtifactError(f"the C++ runner refuses plan {self.plan.entry}: {e}",
                                where=f"plans/{self.plan.entry}.json",
                                expected="a plan it runs", found=str(e)[:300],
                                fix="re-export the model") from None
        self.fn = self.program.run

    @property
    def derives(self) -> bool:
        """Whether the runner holds tensors computed from weights at build time."""
        return self._spec.derives

    def refresh(self) -> None:
        """After weights were overwritten in place (a verified load's checks finishing, a
        load_state_dict): the weights bound as copies, the views of weights the runner folded
        and the weights it laid out for kernels are taken again (the checked steps are kept;
        weights bound as they are see the new values already)."""
        if self.derives:
            weights, _, state = self._python_source
            self._spec.bind(weights, state or {})
            self._build(runner_status()[0])

    def __call__(self, inputs, symbols):
        syms = [symbols[n] for n in self.symbols] if self.symbols else ()
        held = self.deferral.flags
        if held is not None:   # a CUDA graph capture: the error flag is read later
            out, flag = self.program.run_deferred(inputs, syms)
            if flag is not None:
                held.append(flag)
            return out
        out = self.fn(inputs, syms)
        if out.__class__ is tuple:
            return out
        raise self._failed(out, inputs, symbols)

    def _failed(self, out: list, inputs, symbols) -> Exception:
        """The GuardError of a failed run: [step, kernel arguments...] for an index out of
        range, [step, "size", symbol, value] for a value-dependent size out of its range."""
        step = self.plan.steps[out[0]]
        if len(out) == 4 and out[1].__class__ is str:   # "size": never a kernel argument
            return size_error(step, self._spec.symbols[out[2]], out[3])
        return index_error(self.plan, step, dict(enumerate(out[1:])), inputs, symbols)

    def check_flag(self, flag: torch.Tensor, inputs=None, symbols=None) -> None:
        """After a deferred run (a CUDA graph replay): raise if a kernel flagged an index."""
        check_flag(self.plan, flag, inputs, symbols)

    def deferred_flags(self, flags: list):
        return self.deferral.into(flags)

    def guarded(self, guards, device: torch.device):
        """What a user's call runs (CompiledModule.run_flat): `fn(args, check) -> outputs`,
        the guards checked in C++ (runtime/cpp/guards.h) and the plan run with grad mode off,
        in one call into the runner. A call that fails a guard is checked again by `guards`
        (runtime/guards.py), which raise the GuardError. None where the plan reads a symbol no
        input binds (the Python guards then bind them, as before)."""
        spec = guard_spec(guards, self.symbols, device)
        if spec is None:
            return None
        checks = runner_status()[0].Guards(spec)

        def run(args: tuple, check: bool) -> tuple:
            out = self.program.call(checks, args, check)   # (refresh may rebuild the program)
            if out.__class__ is tuple:
                return out
            symbols = guards.check(args, device) if check else guards.bind(args)
            if out is None:   # a guard failed in C++: the Python guards raise its error
                with torch.no_grad():
                    return self(args, symbols)
            raise self._failed(out, args, symbols)
        return run

    @property
    def source(self) -> str:
        """The plan as the Python runner would run it (the C++ runner runs the same steps)."""
        from aotc.runtime.executor import PlanFunction
        from aotc.runtime.module import _SourceOnly
        weights, static, state = self._python_source
        lib = _SourceOnly() if self.library is not None else None
        return PlanFunction(self.plan, weights, self.device, lib, static_weights=static,
                            state=state).source


class _Spec:
    """The runner's spec of one plan (see the module doc)."""
    folding = True   # False: only views of fixed values are taken at load (runtime/folding.py)

    def __init__(self, plan, weights, device, library, static_weights: bool, state: dict):
        self.plan, self.library, self.device = plan, library, device
        self.given = symbol_names(plan)   # read from the inputs, then those calls bind
        self.symbols = self.given + [b.name for s in plan.steps for b in getattr(s, "binds", ())]
        self.exprs: dict = {}
        self.derives = False   # tensors computed from weights: copies bound, folds, layouts
        self.bind(weights, state)
        self.folded = {i for i, s in enumerate(plan.slots)
                       if s.kind is SlotKind.WEIGHT and static_weights}
        self.varying = [i for i, s in enumerate(plan.slots) if s.kind is SlotKind.STATE
                        or (s.kind is SlotKind.WEIGHT and not static_weights)]
        self.checked: set[int] = set()
        self.steps = [self._step(i, s) for i, s in enumerate(plan.steps)]

    def bind(self, weights: dict, state: dict) -> None:
        """The tensors the weight and state slots are bound to (again, after weights change)."""
        bound = bound_tensors(self.plan, weights, state)
        self.constants = [(i, t) for i, t in bound.items()]
        stored = {t.data_ptr() for t in weights.values()}   # a weight bound as a copy derives
        self.derives |= any(self.plan.slots[i].kind is SlotKind.WEIGHT
                            and t.data_ptr() not in stored for i, t in bound.items())

    def as_dict(self) -> dict:
        outputs = [(o.slot, None) if o.slot is not None else (-1, o.const)
                   for o in self.plan.outputs]
        lib = self.library
        return {"entry": self.plan.entry, "slots": len(self.plan.slots),
                "symbols": len(self.symbols), "exprs": [c for _, c in self.exprs.values()],
                "constants": self.constants, "varying": self.varying,
                "inputs": list(self.plan.inputs),
                "steps": self.steps, "outputs": outputs, "device": str(self.device),
                "set_threads": getattr(lib, "set_threads_address", 0) if lib else 0}

    # ----------------------------------------------------------------------------- steps
    def _step(self, idx: int, step) -> tuple:
        if step.kind is StepKind.FREE:
            return ("free", idx, list(step.slots))
        if step.kind is StepKind.KERNEL:
            return self._kernel(idx, step)
        check_call(resolve_op(step.op), step, self.plan.slots)
        fold = (self.folding or step.kind is StepKind.VIEW) and \
            foldable(step, self.folded, self.plan.slots, resolve_op)
        if fold:
            self.folded.add(step.out[0])
            self.derives = True
        op, overload = step.op.rsplit(".", 1)
        binds = [(self.symbols.index(b.name), b.out, -1 if b.dim is None else b.dim, b.lo, b.hi)
                 for b in step.binds]
        return ("call", idx, op, overload, [self._arg(a) for a in step.args],
                [(k, self._arg(v)) for k, v in step.kwargs],
                [o if o is not None else -1 for o in step.out], step.single, fold,
                *([binds] if binds else []))

    def _kernel(self, idx: int, step) -> tuple:
        lib = self.library
        if lib is None:
            raise ArtifactError(f"the plan calls kernel {step.name} but the artifact has no "
                                "kernel library", where=step.name, expected="kernels/",
                                found="none", fix="re-export the model")
        slots = self.plan.slots
        dtypes = [slots[s].dtype for s in (*step.args, *step.out)]
        signature = (step.name, len(step.args) + len(step.out), len(step.sizes), dtypes)
        triton = not hasattr(lib, "kernel_address")
        fn = 0 if triton else lib.kernel_address(*signature)
        args = [self._kernel_arg(i) for i in step.args]
        reuse = dict(step.reuse)
        outs = []
        for o in step.out:
            s, donor = slots[o], reuse.get(o, -1)
            view = donor >= 0 and s.contiguous and slots[donor].contiguous
            outs.append((o, s.dtype, self._dims(s.shape), self._dims(s.stride), s.contiguous,
                         donor, view))
        sizes = [self.symbols.index(n) for n in step.sizes]
        if not triton and self.folding and kernel_foldable(step, self.folded, slots):
            self.folded |= set(step.out)   # run at load by the runner (program.cpp)
            self.derives = True
        if not triton:   # (a library's own table says whether the kernel takes its room)
            room = getattr(lib, "takes_room", lambda _: False)(step.name)
            return ("kernel", idx, step.name, fn, args, outs, sizes, *((True,) if room else ()))
        if step.launch is None:
            raise ArtifactError(f"plan step {idx} runs Triton kernel {step.name} without its "
                                "launch", where=f"plans/{self.plan.entry}.json",
                                expected="a grid", found="none", fix="re-export the model")
        extents = lib.spec(step.name).extents   # (format >= 19; checked before each launch)
        launch = (lib.runner_launcher(*signature), self._dims(step.launch.grid),
                  step.launch.error_code or 0, *((self._dims(extents),) if extents else ()))
        return ("kernel", idx, step.name, 0, args, outs, sizes, launch)

    def _kernel_arg(self, i: int) -> tuple:
        """(slot, lay out?, contiguous, strides, shape, dtype): values not written by a kernel
        get the strides the kernel was compiled for, at their first kernel use, after a check
        of their shape and dtype against the slot's (weights are bound as their slots want
        them; views of weights are laid out once, at load)."""
        s = self.plan.slots[i]
        lay_out = s.kind not in (SlotKind.WEIGHT, SlotKind.STATE) and (
            i in self.folded or (s.producer is not StepKind.KERNEL and i not in self.checked))
        if lay_out and i not in self.folded:
            self.checked.add(i)
        self.derives |= lay_out and i in self.folded
        return (i, lay_out, s.contiguous, self._dims(s.stride), self._dims(s.shape),
                s.dtype if lay_out else "")

    # ------------------------------------------------------------------------- arguments
    def _arg(self, a) -> tuple:
        if a is None:
            return ("n",)
        if isinstance(a, bool):
            return ("b", a)
        if isinstance(a, int):
            return ("i", a)
        if isinstance(a, float):
            return ("f", a)
        if isinstance(a, str):
            return ("s", a)
        if isinstance(a, tuple):
            return ("list", [self._arg(x) for x in a])
        if isinstance(a, SlotRef):
            return ("slot", a.slot)
        if isinstance(a, SymArg):
            return ("sym", self._expr(a.expr))
        if isinstance(a, Tagged):
            if a.tag == "device":
                return ("device",)   # plans run on the device the artifact is loaded on
            return ("f", float(a.value)) if a.tag == "float" else (a.tag, a.value)
        raise ArtifactError(f"an argument the C++ runner cannot pass: {type(a).__name__}",
                            where=f"plans/{self.plan.entry}.json", expected="a plan argument",
                            found=type(a).__name__, fix="re-export the model")

    def _dims(self, dims) -> list:
        return [d if isinstance(d, int) else d.value if isinstance(d, ex.Const)
                else [self._expr(d)] for d in dims]

    def _expr(self, node) -> int:
        """The index of `node`'s bytecode in the spec's expression table (shared by text)."""
        key = ex.text(node)
        if key not in self.exprs:
            code: list[int] = []
            _emit(node, self.symbols, code)
            self.exprs[key] = (len(self.exprs), code)
        return self.exprs[key][0]


def guard_spec(guards, plan_symbols: list[str], device: torch.device) -> dict | None:
    """The C++ guards' spec of runtime/guards.py `guards` (runtime/cpp/guards.h), binding
    `plan_symbols` in that order; None where a plan symbol is not read from an input."""
    names = sorted(set(guards.symbols) | guards.bound_symbols)
    if not set(plan_symbols) <= guards.bound_symbols:
        return None
    exprs: dict = {}

    def expr(node) -> int:
        if ex.text(node) not in exprs:
            code: list[int] = []
            _emit(node, names, code)
            exprs[ex.text(node)] = (len(exprs), code)
        return exprs[ex.text(node)][0]

    def dim(d) -> tuple:   # (0, a static size) | (1, a symbol) | (2, an expression)
        if isinstance(d, int):
            return 0, d
        return (1, names.index(d.name)) if isinstance(d, ex.Sym) else (2, expr(d))
    inputs = [(str(g.dtype).removeprefix("torch."), [dim(d) for d in g.shape])
              for g in guards.inputs]
    relations = [expr(r) for r in guards.relations]
    return {"symbols": len(names), "exprs": [c for _, c in exprs.values()],
            "ranges": [guards.symbols.get(n, (-2**63, 2**63 - 1)) for n in names],
            "relations": relations, "inputs": inputs, "device": device.type,
            "plan_symbols": [names.index(n) for n in plan_symbols],
            # what the C++ front end's guard errors quote (runtime/guards.py's messages)
            "names": names, "texts": list(exprs),
            "input_names": [g.name for g in guards.inputs],
            "input_specs": [g.spec for g in guards.inputs]}


def _emit(n, symbols: list[str], code: list[int]) -> None:
    """Postfix bytecode of an integer expression node (runtime/cpp/expr.h)."""
    if isinstance(n, ex.Const):
        code += [0, n.value]
    elif isinstance(n, ex.Sym):
        code += [1, symbols.index(n.name)]
    elif isinstance(n, (ex.Neg, ex.Not)):
        _emit(n.arg, symbols, code)
        code.append(2 if isinstance(n, ex.Neg) else 18)
    elif isinstance(n, ex.Bin) and n.op in _OPS:
        _emit(n.left, symbols, code)
        _emit(n.right, symbols, code)
        code.append(_OPS[n.op])
    elif isinstance(n, ex.Call):
        for a in n.args:
            _emit(a, symbols, code)
        code += [8 if n.fn == "min" else 9, len(n.args)]
    else:
        raise ArtifactError(f"an expression the runner does not know: {ex.text(n)}",
                            where="plan sizes", expected="the schema's expression grammar",
                            found=ex.text(n), fix="re-export the model")


def plan_function(plan, weights: dict, device: torch.device, library=None, *,
                  runner: str | None = None, static_weights: bool = True,
                  state: dict | None = None) -> tuple[object, str]:
    """(the plan's function, which runner runs it: "cpp", or "python" with the reason).
    `runner`: None picks the C++ runner where it runs this plan, "python" forces the Python
    runner, "cpp" insists (a UsageError says why it cannot)."""
    from aotc.runtime.executor import PlanFunction
    why = _why_python(device, runner,
                      triton=library is not None and not hasattr(library, "kernel_address"))
    if why is None:
        why = _collectives(plan)
    if why is None:
        try:
            return CppPlanFunction(plan, weights, device, library, static_weights=static_weights,
                                   state=state), "cpp"
        except runner_status()[0].Unsupported as e:
            why = f"the C++ runner does not run plan {plan.entry}: {e}"
    if runner == "cpp":
        from aotc.errors import UsageError
        raise UsageError(f"the C++ runner cannot run this artifact: {why}",
                         where="aotc.load(runner='cpp')", expected="a CPU artifact and aotc "
                         "installed with its C++ runner", found=why,
                         fix="load with runner=None (the Python runner then runs it)")
    return PlanFunction(plan, weights, device, library, static_weights=static_weights,
                        state=state), f"python ({why})"


def _collectives(plan) -> str | None:
    """Why the C++ runner declines a plan that calls torch.distributed, or None."""
    from aotc.runtime.aotc_ops import COLLECTIVES
    ops = sorted({s.op for s in plan.steps if getattr(s, "op", None) in COLLECTIVES})
    return (f"plan {plan.entry} calls collectives ({', '.join(ops)}), which the C++ runner "
            "does not run; the Python runner calls torch.distributed") if ops else None


def expected_runner(manifest) -> str:
    """The runner `aotc.load(path)` runs this artifact's plans with here (`aotc inspect`)."""
    from aotc.artifact.schema.manifest import TritonNative
    target = manifest.target
    why = _why_python(torch.device(target.device.value), None,
                      triton=isinstance(target.native, TritonNative))
    if why is None and manifest.tensor_parallel is not None:
        why = ("the plans call collectives (aotc::all_reduce, aotc::all_gather), which the "
               "C++ runner does not run; the Python runner calls torch.distributed")
    return "cpp (aotc's C++ plan runner)" if why is None else f"python ({why})"


def _why_python(device: torch.device, runner: str | None, *, triton: bool) -> str | None:
    """Why the Python runner runs a plan, or None when the C++ runner is to."""
    if runner not in (None, *RUNNERS):
        from aotc.errors import UsageError
        raise UsageError(f"unknown runner {runner!r}", where="aotc.load(runner=)",
                         expected=["cpp", "python", None], found=repr(runner)[:40],
                         fix="pass runner='cpp', runner='python', or leave it unset")
    if runner == "python":
        return "asked for"
    if runner is None and device.type not in ("cpu", "cuda"):
        return (f"plans on {device.type} run with the Python runner unless runner='cpp' is "
                "passed (the C++ runner is measured on CPUs and NVIDIA GPUs)")
    if runner is None and triton and device.type == "cpu":
        return ("Triton's interpreter runs these kernels (interpret=True); runner='cpp' runs "
                "the plan in C++ around it")
    return runner_status()[1] or None
