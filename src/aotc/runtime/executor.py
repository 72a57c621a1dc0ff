"""Plan -> Python function.

At load time a typed plan (artifact/schema/plan.py, already checked field by field and as a
program) is turned into the source of one straight-line Python function (one line per step: a
kernel call, an ATen call, a view, a `del` where a value's last use has passed), compiled once
and kept. Calling it does no graph interpretation: no per-step dispatch on step kinds, no
argument decoding, no lookups by name. The source is kept on the module
(`CompiledModule.code`) so what runs can be read, printed and debugged.

No text of the artifact ever becomes source: names in the function are aotc's own (`v12` for a
slot, `S_seq` for a size symbol already checked to be an ASCII identifier, `k3` for a kernel),
sizes are printed back from parsed expression nodes, and every other value (ops from the fixed
table, dtypes, strings, weights, kernels) is bound as a global under a name aotc chooses.
"""
from __future__ import annotations

import ctypes
import functools
import re
import threading
from contextlib import contextmanager

import torch

from aotc.errors import ArtifactError, GuardError
from aotc.runtime.argcheck import check_call
from aotc.runtime.bound import _weight, bound_tensors, load_transform  # noqa: F401
from aotc.artifact.dtypes import DTYPES, LAYOUTS, MEMORY_FORMATS
from aotc.runtime.folding import foldable, kernel_foldable
from aotc.runtime.indices import index_error
from aotc.runtime.native import thread_count
from aotc.runtime.room import (extent_check_lines, keep_room, room_array, room_error,
                              slot_room, span, tensor_room)
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.flow import step_symbols
from aotc.artifact.schema.plan import SlotRef, SymArg, Tagged
from aotc.artifact.schema.types import SlotKind, StepKind


def _shape(dims) -> str:
    """Python source of a shape or stride tuple whose entries may be expression nodes."""
    parts = [str(d) if isinstance(d, int) else ex.source(d) for d in dims]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _layout(t: torch.Tensor, stride: tuple, contiguous: bool, shape: tuple = None,
            dtype: torch.dtype = None, slot: int = -1) -> torch.Tensor:
    """`t` with the strides a kernel was compiled for (a copy only when they differ), after a
    check that it has the slot's shape and dtype: the kernel indexes it by them, so a smaller
    value (an ATen result or a view that a hostile plan makes disagree with its slot) would be
    read out of bounds."""
    if shape is not None and (tuple(t.shape) != shape or t.dtype != dtype):
        raise ArtifactError("a kernel's argument is not what the plan declares",
                            where=f"slot {slot}",
                            expected=f"{str(dtype).removeprefix('torch.')}{list(shape)}",
                            found=f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}",
                            fix="re-export the model (the plan's calls disagree with its slots)")
    if contiguous:
        return t if t.is_contiguous() else t.contiguous()
    if all(a == b for a, b, n in zip(t.stride(), stride, t.shape) if n > 1):
        return t
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


# ATen ops called as tensor methods (name, positional argument count) or torch functions; the
# plan's arguments are these bindings' positional arguments in the same order
_METHODS = {"aten::view.default": ("view", 2), "aten::reshape.default": ("reshape", 2),
            "aten::permute.default": ("permute", 2), "aten::expand.default": ("expand", 2),
            "aten::select.int": ("select", 3), "aten::unsqueeze.default": ("unsqueeze", 2),
            "aten::t.default": ("t", 1), "aten::transpose.int": ("transpose", 3)}
_FUNCTIONS = {"aten::addmm.default": torch.addmm, "aten::mm.default": torch.mm,
              "aten::bmm.default": torch.bmm, "aten::baddbmm.default": torch.baddbmm}


@functools.cache
def runner_mm():
    """aten::mm as the C++ runner computes it where that runner is here (on the CPU, float32
    products of few rows by its own loop: runtime/cpp/few_rows.cpp), so that both runners give
    the same bits; else torch's."""
    from aotc.runtime.cpp_runner import runner_status
    runner, _ = runner_status()
    return runner.mm if runner is not None else torch.mm


def resolve_op(qualname: str):
    """'aten::addmm.default' -> torch.ops.aten.addmm.default. The name comes from the fixed
    op table (artifact/schema/ops.py), checked when the plan was parsed."""
    ns, rest = qualname.split("::")
    if ns == "aotc":     # aotc's own ops, implemented by the runtime (runtime/aotc_ops.py)
        from aotc.runtime.aotc_ops import OPS
        return OPS[qualname][0]
    name, overload = rest.rsplit(".", 1)
    try:
        return getattr(getattr(torch.ops.aten, name), overload)
    except (AttributeError, RuntimeError):
        raise ArtifactError(f"the plan calls operator {qualname}, which this torch does not have",
                            where=qualname, expected=f"torch {torch.__version__} to provide it",
                            found="no such operator",
                            fix="re-export the model with this torch version") from None


class PlanFunction:
    """A plan compiled to a Python function `fn(inputs, symbols) -> tuple of outputs`."""

    def __init__(self, plan, weights: dict[str, torch.Tensor], device: torch.device,
                 library=None, *, static_weights: bool = True, state: dict | None = None):
        """`static_weights`: weights never move, so their data pointers are taken once, at
        load (inference); training parameters are read at each call. `state`: a generator's
        persistent tensors by name (the plan updates them in place)."""
        self.plan, self.library, self.static_weights = plan, library, static_weights
        self.state = state or {}
        self.line_steps: dict[int, int] = {}   # line of the source -> the plan step it runs
        self.device = device
        self.deferral = FlagDeferral()
        # (global name, how to compute it again) of every tensor derived from weights at
        # load: refreshed in place when weights are swapped (runtime/statedict.py)
        self.derived: list[tuple[str, object]] = []
        self.threads = thread_count(library)
        self.namespace: dict = {"torch": torch, "DEVICE": device, "empty": torch.empty,
                                "empty_strided": torch.empty_strided, "layout": _layout,
                                "kernel_failed": self.kernel_failed, "LIB": library,
                                "room_of": tensor_room, "room_span": span, "keep_room": keep_room,
                                "size_failed": self.size_failed,
                                "check_error_flag": self._flag}
        emitter = _Emitter(self, plan, weights)
        self.source = emitter.emit()
        code = compile(self.source, f"<aotc plan {plan.entry}>", "exec")
        exec(code, self.namespace)  # noqa: S102 - source printed by _Emitter from parsed nodes
        self.fn = self.namespace[f"plan_{plan.entry}"]
        if emitter.folds:   # shown after the plan (its line numbers unchanged); run at load
            self.source += "\n# run once, at load (runtime/folding.py)\n" + "\n".join(emitter.folds)

    def bind(self, value, base: str) -> str:
        """Bind `value` as a global of the plan function; its name (aotc's own)."""
        name = f"{base}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def bind_derived(self, make, base: str, value=None) -> str:
        """Bind `make()` (or `value`, which it made already), a tensor computed from weights,
        and remember how to recompute it."""
        name = self.bind(make() if value is None else value, base)
        self.derived.append((name, make))
        return name

    def refresh(self) -> None:
        """After weights were overwritten in place: recompute, in place, each derived tensor
        that is a copy (views see the new values already), in the order they were made, so the
        data pointers the plan and CUDA graphs captured stay valid."""
        for name, make in self.derived:
            held, fresh = self.namespace[name], make()
            if fresh.data_ptr() != held.data_ptr() or fresh.stride() != held.stride():
                held.copy_(fresh)

    def __call__(self, inputs, symbols):
        if self.threads is not None:
            self.threads()
        return self.fn(inputs, symbols)

    # --------------------------------------------------------------------- index errors
    def index_failed(self, step_index: int, tensors: tuple, symbols: dict, inputs=None):
        """A C++ kernel met an out-of-range index: raise the GuardError that names it."""
        step = self.plan.steps[step_index]
        raise index_error(self.plan, step, dict(enumerate(tensors)), inputs, symbols)

    def kernel_failed(self, step_index: int, code: int, rooms, tensors: tuple, symbols: dict,
                      inputs=None):
        """A C++ kernel refused its buffers (code < 0) or met an out-of-range index."""
        if code < 0:
            raise room_error(self.plan, step_index, code, rooms)
        self.index_failed(step_index, tensors, symbols, inputs)

    def size_failed(self, step_index: int, name: str, value: int):
        """A value-dependent size outside the range export proved for it."""
        raise size_error(self.plan.steps[step_index], name, value)

    def check_flag(self, flag: torch.Tensor, inputs=None, symbols=None) -> None:
        """After a plan with index-checking Triton kernels: raise if one flagged an index."""
        check_flag(self.plan, flag, inputs, symbols)

    def _flag(self, flag: torch.Tensor, inputs=None, symbols=None) -> None:
        """The plan's read of its error flag: checked now, or kept (FlagDeferral)."""
        held = self.deferral.flags
        if held is None:
            check_flag(self.plan, flag, inputs, symbols)
        else:
            held.append(flag)

    def deferred_flags(self, flags: list):
        return self.deferral.into(flags)


def size_error(step, name: str, value: int) -> GuardError:
    b = next(b for b in step.binds if b.name == name)
    where = f"the result of {step.op}" + (f" ({step.source})" if step.source else "")
    return GuardError(f"{where} has {name}={value}, outside the range [{b.lo}, {b.hi}] export "
                      "proved for it", where=where, expected=f"{b.lo} <= {name} <= {b.hi}",
                      found=value, fix="these inputs' values select more than the model's "
                      "code allows at export; check the inputs, or re-export the model")


class FlagDeferral:
    """Where a plan run on the calling thread puts the error flags of its index-checking Triton
    kernels instead of reading them: a CUDA graph capture cannot read them (runtime/graphs.py
    checks them after each replay). Per thread, so a plain call on another thread during a
    capture still checks its indices."""

    def __init__(self):
        self._local = threading.local()

    @property
    def flags(self) -> list | None:
        return getattr(self._local, "flags", None)

    @contextmanager
    def into(self, flags: list):
        self._local.flags = flags
        try:
            yield
        finally:
            self._local.flags = None


def check_flag(plan, flag: torch.Tensor, inputs=None, symbols=None) -> None:
    """After `plan` ran with index-checking Triton kernels: raise the GuardError of the kernel
    whose code `flag` holds, if one stored its code."""
    code = int(flag.item())
    if not code:
        return
    for step in plan.steps:
        if step.kind is StepKind.KERNEL and step.launch is not None \
                and step.launch.error_code == code:
            raise index_error(plan, step, {}, inputs, symbols or {})
    raise index_error(plan, _Unknown(code), {}, inputs, symbols or {})


class _Unknown:
    checks, name = (), "?"

    def __init__(self, code):
        self.name = f"with error code {code}"


class _Emitter:
    """Writes the source of one plan function (see the module doc)."""

    def __init__(self, fn: PlanFunction, plan, weights: dict):
        self.fn, self.plan, self.weights = fn, plan, weights
        self.names: dict[int, str] = {}
        self.folded: set[int] = set()     # fixed at load: weights, and what folds compute
        self.computed: set[int] = set()   # folded results that are new tensors (not views)
        self.folds: list[str] = []        # sources of the kernels run at load
        self.checked: set[int] = set()    # slots already laid out for a kernel

    def emit(self) -> str:
        plan = self.plan
        bound = bound_tensors(plan, self.weights, self.fn.state)
        for i, s in enumerate(plan.slots):
            if s.kind is SlotKind.WEIGHT:
                self.names[i] = self.fn.bind_derived(
                    lambda s=s: _weight(s, self.weights), "w", value=bound[i])
                if self.fn.static_weights:
                    self.folded.add(i)
            elif s.kind is SlotKind.STATE:   # bound, never folded: its values change
                self.names[i] = self.fn.bind(bound[i], "st")
            else:
                self.names[i] = f"v{i}"
        lines = [f"def plan_{plan.entry}(inputs, symbols):"]
        lines += [f"    S_{n} = symbols[{n!r}]" for n in symbol_names(plan)]
        flagged = any(s.kind is StepKind.KERNEL and s.launch is not None
                      and s.launch.error_code for s in plan.steps)
        if flagged:
            lines += ["    ARGS = tuple(inputs)", "    ERR = LIB.new_error_flag()"]
        ins = [self.names[i] for i in plan.inputs]
        if ins:
            lines.append(f"    {', '.join(ins)}, = inputs")
            # a caller that hands over a list gives up its references (a training backward
            # passing what forward saved): the plan's FREE steps then free each input
            lines.append("    if inputs.__class__ is list: inputs.clear()")
        for idx, step in enumerate(plan.steps):
            body = self._step(idx, step)
            self.fn.line_steps.update({len(lines) + 1 + k: idx for k in range(len(body))})
            lines += body
        if flagged:
            lines.append("    check_error_flag(ERR, ARGS, symbols)")
        rets = [self._const(o.const) if o.slot is None else f"{self.names[o.slot]}.clone()"
                if o.slot in self.computed else self.names[o.slot] for o in plan.outputs]
        lines.append(f"    return ({', '.join(rets)}{',' if len(rets) == 1 else ''})")
        return "\n".join(lines) + "\n"

    def _step(self, idx: int, step) -> list[str]:
        if step.kind is StepKind.FREE:
            dead = [self.names[i] for i in step.slots if i not in self.folded]
            return [f"    del {', '.join(dead)}"] if dead else []
        if step.kind is StepKind.KERNEL:
            if kernel_foldable(step, self.folded, self.plan.slots):
                return self._fold_kernel(idx, step)
            return self._kernel(idx, step)
        op = resolve_op(step.op)
        check_call(op, step, self.plan.slots)
        args = [self._arg(a) for a in step.args]
        args += [f"{k}={self._arg(v)}" for k, v in step.kwargs]
        call = self._call(step, op, args)
        if foldable(step, self.folded, self.plan.slots, resolve_op):
            out = step.out[0]   # of fixed values only: taken once, here (runtime/folding.py)
            self.names[out] = self.fn.bind_derived(   # (reshape may copy: then refreshed)
                lambda: eval(call, self.fn.namespace), "c")  # noqa: S307 - source printed above
            self.folded.add(out)
            if step.kind is StepKind.EXTERN:
                self.computed.add(out)
            return []
        outs = [self.names[o] if o is not None else "_" for o in step.out]
        target = outs[0] if step.single else ", ".join(outs) + ","
        return [f"    {target} = {call}", *self._binds(idx, step)]

    def _binds(self, idx: int, step) -> list[str]:
        """Lines that read the sizes a call's result defines and check their ranges."""
        lines = []
        for b in step.binds:
            value = self.names[step.out[b.out]]
            lines += [f"    S_{b.name} = symbols[{b.name!r}] = "
                      f"{value if b.dim is None else f'{value}.shape[{b.dim}]'}",
                      f"    if not {b.lo} <= S_{b.name} <= {b.hi}: "
                      f"size_failed({idx}, {b.name!r}, S_{b.name})"]
        return lines

    def _call(self, step, op, args: list[str]) -> str:
        """Source of one ATen call: common views and matmuls through torch's Python bindings
        (about 1 us cheaper per call than an OpOverload), the rest through the overload."""
        method = _METHODS.get(step.op)
        if method is not None and not step.kwargs and len(step.args) == method[1]:
            return f"{args[0]}.{method[0]}({', '.join(args[1:])})"
        fn = runner_mm() if step.op == "aten::mm.default" else _FUNCTIONS.get(step.op, op)
        return f"{self.fn.bind(fn, 'op')}({', '.join(args)})"

    def _arg(self, a) -> str:
        if isinstance(a, tuple):
            return "[" + ", ".join(self._arg(x) for x in a) + "]"
        if isinstance(a, SlotRef):
            return self.names[a.slot]
        if isinstance(a, SymArg):
            return f"({ex.source(a.expr)})"
        if isinstance(a, Tagged):
            if a.tag == "device":
                return "DEVICE"   # plans are placed on the device the artifact is loaded on
            table = {"dtype": DTYPES, "layout": LAYOUTS, "memory_format": MEMORY_FORMATS}
            value = table[a.tag][a.value] if a.tag in table else float(a.value)
            return self.fn.bind(value, "t")
        return self._const(a)

    def _const(self, value) -> str:
        if value is None or isinstance(value, (bool, int)):
            return repr(value)
        return self.fn.bind(value, "k")    # floats and strings: never printed into source

    def _fold_kernel(self, idx: int, step) -> list[str]:
        """Run a kernel of fixed inputs once, now, as a function of its own kept for
        `refresh`; its outputs become globals. The plan drops the dead buffer the kernel
        would have reused instead."""
        lines = self._kernel(idx, step, reuse={})
        flag = step.launch is not None and step.launch.error_code
        body = ["    symbols, inputs = {}, ()", *(["    ERR = LIB.new_error_flag()"] * bool(flag)),
                *lines, *(["    check_error_flag(ERR, inputs, symbols)"] * bool(flag)),
                f"    return ({', '.join(self.names[o] for o in step.out)},)"]
        source = f"def fold_{idx}():\n" + "\n".join(body) + "\n"
        self.folds.append(source)
        exec(compile(source, f"<aotc fold {self.plan.entry} step {idx}>", "exec"),  # noqa: S102
             self.fn.namespace)   # printed from parsed nodes, as the plan function is
        run = self.fn.namespace[f"fold_{idx}"]
        slots = self.plan.slots   # a source-only plan (aotc inspect --code) runs no kernel
        first = run() if getattr(self.fn.library, "runs", True) else tuple(
            torch.empty_strided(slots[o].shape, slots[o].stride, dtype=DTYPES[slots[o].dtype])
            for o in step.out)
        for j, o in enumerate(step.out):
            self.names[o] = self.fn.bind_derived(lambda j=j: run()[j], "f", value=first[j])
            self.folded.add(o)
            self.computed.add(o)
        return [f"    del {self.names[d]}" for _, d in step.reuse if d not in self.folded]

    def _kernel(self, idx: int, step, reuse: dict | None = None) -> list[str]:
        """Lines that allocate a kernel's outputs and call it with data pointers."""
        lib = self.fn.library
        if lib is None:
            raise ArtifactError(f"the plan calls kernel {step.name} but the artifact has no "
                                "kernel library", where=step.name, expected="kernels/",
                                found="none", fix="re-export the model")
        triton = step.launch is not None   # a Triton kernel (CUDA artifact): tensors
        slots = self.plan.slots
        dtypes = [slots[s].dtype for s in (*step.args, *step.out)]
        k = self.fn.bind(lib.kernel(step.name, len(step.args) + len(step.out), len(step.sizes),
                                    dtypes), "k")
        ptr = (lambda e: e) if triton else (lambda e: f"{e}.data_ptr()")
        lines, ptrs, rooms = [], [], []
        for i in step.args:
            ptrs.append(self._kernel_arg(i, triton, lines, ptr, rooms))
        if reuse is None:   # a folded buffer is never taken over: it lives on
            reuse = {o: d for o, d in step.reuse if d not in self.folded}
        for o in step.out:
            lines.append(self._alloc(o, reuse.get(o)))
            if o in reuse:
                lines.append(f"    del {self.names[reuse[o]]}")
            ptrs.append(ptr(self.names[o]))
            rooms.append(slot_room(slots[o], _shape))
        room = "None"
        if not triton and getattr(lib, "takes_room", lambda _: False)(step.name):
            room = self._room_array(rooms, lines)
            ptrs.append(room)
        sizes = [f"S_{n}" for n in step.sizes]
        if triton:
            lines += extent_check_lines(self.fn, self.plan, idx, rooms,
                                        lib.spec(step.name).extents)
            grid = ", ".join(ex.source(g) for g in step.launch.grid)
            err = ["ERR"] if step.launch.error_code else []
            return lines + [f"    {k}(({grid}), {', '.join(ptrs + err + sizes)})"]
        args = ", ".join(self.names[i] for i in step.args)
        lines.append(f"    if (err := {k}({', '.join(ptrs + sizes)})): "
                     f"kernel_failed({idx}, err, {room}, "
                     f"({args}{',' if len(step.args) == 1 else ''}), symbols, inputs)")
        return lines

    def _room_array(self, rooms: list, lines: list) -> str:
        """The room array of a C++ kernel's call (runtime/room.py): made once when every room
        is known at load; else, when the rooms depend on sizes alone, once per sizes seen (a
        kernel writes the array only where it refuses a call); else per call."""
        if all(isinstance(r, int) for r in rooms):
            return self.fn.bind(room_array(rooms), "room")
        kind = self.fn.bind(ctypes.c_int64 * (2 * len(rooms)), "rooms")
        make = f"{kind}({', '.join(map(str, rooms))})"
        if any("room_of(" in str(r) for r in rooms):   # a tensor measured per call
            lines.append(f"    ROOM = {make}")
            return "ROOM"
        sizes = sorted(set(re.findall(r"\bS_\w+", " ".join(map(str, rooms)))))
        key, cache = f"({''.join(f'{z}, ' for z in sizes)})", self.fn.bind({}, "roomcache")
        lines += [f"    ROOM = {cache}.get({key})",
                  f"    if ROOM is None: ROOM = keep_room({cache}, {key}, {make})"]
        return "ROOM"

    def _kernel_arg(self, i: int, triton: bool, lines: list, ptr, rooms: list) -> str:
        """The pointer source of a kernel's argument `i`; its room appended to `rooms`."""
        s, name = self.plan.slots[i], self.names[i]
        rooms.append(slot_room(s, _shape))
        if s.kind is SlotKind.WEIGHT and self.fn.static_weights:
            w = self.fn.namespace[name]
            rooms[-1] = tensor_room(w)
            return self.fn.bind(w if triton else w.data_ptr(), "p")
        if s.kind in (SlotKind.WEIGHT, SlotKind.STATE):   # dense as allocated: as they are
            rooms[-1] = (tensor_room(self.fn.namespace[name]) if s.kind is SlotKind.STATE
                         else f"room_of({name})")   # a parameter's data may be replaced
            return ptr(name)
        if i in self.folded:   # a view of weights, taken at load: laid out once, here
            held = self.fn.bind_derived(   # owns the memory the pointer points to
                lambda: _layout(self.fn.namespace[name], s.stride, s.contiguous,
                                *((tuple(s.shape), DTYPES[s.dtype], i)
                                  if all(isinstance(d, int) for d in s.shape) else ())), "l")
            t = self.fn.namespace[held]
            rooms[-1] = tensor_room(t)
            return self.fn.bind(t if triton else t.data_ptr(), "p")
        if s.producer is not StepKind.KERNEL and i not in self.checked:
            self.checked.add(i)
            dt = self.fn.bind(DTYPES[s.dtype], "dt")
            lines.append(f"    {name} = layout({name}, {_shape(s.stride)}, {s.contiguous}, "
                         f"{_shape(s.shape)}, {dt}, {i})")
        return ptr(name)

    def _alloc(self, o: int, donor: int | None) -> str:
        s, name = self.plan.slots[o], self.names[o]
        if donor is not None:   # memory planning: take over a dead buffer's storage
            same = s.contiguous and self.plan.slots[donor].contiguous
            return (f"    {name} = {self.names[donor]}.view({_shape(s.shape)})" if same else
                    f"    {name} = {self.names[donor]}.as_strided({_shape(s.shape)}, "
                    f"{_shape(s.stride)})")
        dtype = self.fn.bind(DTYPES[s.dtype], "dt")
        if s.contiguous:
            return f"    {name} = empty({_shape(s.shape)}, dtype={dtype}, device=DEVICE)"
        return (f"    {name} = empty_strided({_shape(s.shape)}, {_shape(s.stride)}, "
                f"dtype={dtype}, device=DEVICE)")


def symbol_names(plan) -> list[str]:
    """Every size symbol the plan uses that its inputs bind, sorted (those its calls bind,
    value-dependent sizes, are read from their results)."""
    out = set(plan.symbols)
    for s in plan.steps:
        out |= step_symbols(s, plan.slots)
    return sorted(out - step_bound(plan))


def step_bound(plan) -> set[str]:
    """The size symbols the plan's calls bind."""
    return {b.name for s in plan.steps for b in getattr(s, "binds", ())}
