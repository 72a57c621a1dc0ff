"""Plan -> Python function.

At load time a plan is turned into the source of one straight-line Python function (one line per
step: an ATen call, a view, a `del` where a value's last use has passed), compiled once and kept.
Calling it does no graph interpretation: no per-step dispatch on step kinds, no argument
decoding, no lookups by name. The source is kept on the module (`CompiledModule.code`) so what
runs can be read, printed and debugged.
"""
from __future__ import annotations

import re

import torch

from aotc.errors import ArtifactError
from aotc.runtime.native import kernel, kernel_failed, thread_count
from aotc.runtime.plan import SlotKind, StepKind, decode_arg, sym_source


def _shape(dims) -> str:
    """Python source of a shape or stride tuple whose entries may be symbol expressions."""
    parts = [str(d) if isinstance(d, int) else sym_source(d) for d in dims]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _layout(t: torch.Tensor, stride: tuple, contiguous: bool) -> torch.Tensor:
    """`t` with the strides a kernel was compiled for (a copy only when they differ)."""
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


def _reads_only(step: dict, slots: set) -> bool:
    """Whether every tensor the step reads is in `slots` (and no size is symbolic)."""
    found = []

    def walk(a):
        if isinstance(a, list):
            return all(walk(x) for x in a)
        if isinstance(a, dict):
            if "sym" in a:
                return False
            if "slot" in a:
                found.append(a["slot"])
        return True
    ok = walk(step["args"]) and walk(list(step["kwargs"].values()))
    return ok and bool(found) and all(i in slots for i in found)


def _weight(slot: dict, weights: dict) -> torch.Tensor:
    """A weight as its slot wants it: "memory_format": "channels_last" (a convolution weight
    that the plan runs channels-last) is converted here, once, at load; "layout": "transposed"
    (a matmul weight stored as its [K, N] transpose, codegen/layouts.py) is bound as a view of
    the stored tensor, its logical [N, K] shape with strides [1, N], at no cost."""
    w = weights[slot["weight"]]
    if slot.get("layout") == "transposed" and w.dim() == 2:
        w = w.t()
    if slot.get("memory_format") == "channels_last" and w.dim() == 4:
        w = w.contiguous(memory_format=torch.channels_last)
    shape = slot.get("shape")
    if shape is not None and all(isinstance(d, int) for d in shape) and list(w.shape) != shape:
        raise ArtifactError(f"weight {slot['weight']!r} has shape {list(w.shape)} in "
                            f"weights.safetensors, its plan slot says {shape}",
                            where=slot["weight"], expected=shape, found=list(w.shape),
                            fix="re-export the model (the weights file does not match the plan)")
    return w


def resolve_op(qualname: str):
    """'aten::addmm.default' -> torch.ops.aten.addmm.default."""
    try:
        ns, rest = qualname.split("::")
        name, overload = rest.rsplit(".", 1)
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (ValueError, AttributeError, RuntimeError):
        raise ArtifactError(f"the plan calls operator {qualname}, which this torch does not have",
                            where=qualname, expected=f"torch {torch.__version__} to provide it",
                            found="no such operator",
                            fix="import the library that registers it before loading, or "
                                "re-export with this torch version") from None


def _ident(text: str) -> str:
    s = re.sub(r"\W", "_", text)
    return s if s[:1].isalpha() or s[:1] == "_" else f"_{s}"


class PlanFunction:
    """A plan compiled to a Python function `fn(inputs, symbols) -> tuple of outputs`."""

    def __init__(self, plan: dict, weights: dict[str, torch.Tensor], device: torch.device,
                 library=None, *, static_weights: bool = True):
        """`static_weights`: weights never move, so their data pointers are taken once, at
        load (inference); training parameters are read at each call."""
        self.library, self.static_weights = library, static_weights
        self.threads = thread_count(library)
        self.namespace: dict = {"torch": torch, "DEVICE": device, "empty": torch.empty,
                                "empty_strided": torch.empty_strided,
                                "layout": _layout, "kernel_failed": kernel_failed}
        self.source = self._emit(plan, weights)
        code = compile(self.source, f"<aotc plan {plan['entry']}>", "exec")
        exec(code, self.namespace)  # noqa: S102 - source generated above from a verified plan
        self.fn = self.namespace[f"plan_{plan['entry']}"]

    def _global(self, base: str, value) -> str:
        name, i = _ident(base), 1
        while name in self.namespace and self.namespace[name] is not value:
            i += 1
            name = f"{_ident(base)}_{i}"
        self.namespace[name] = value
        return name

    def _slot_names(self, slots: list, weights: dict) -> dict[int, str]:
        """Slot -> the name the plan's source uses: weights are globals bound at load,
        everything else a local `v<slot>`."""
        names = {}
        for i, s in enumerate(slots):
            if s["kind"] == SlotKind.WEIGHT:
                if s["weight"] not in weights:
                    raise ArtifactError(f"the plan uses weight {s['weight']!r}, which "
                                        "weights.safetensors lacks", where=s["weight"],
                                        expected="the weight", found="nothing",
                                        fix="re-export the model")
                names[i] = self._global(f"w_{s['weight']}", _weight(s, weights))
            else:
                names[i] = f"v{i}"
        return names

    def _emit(self, plan: dict, weights: dict) -> str:
        slots = plan["slots"]
        names = self._slot_names(slots, weights)
        slot_name = names.__getitem__
        device = self.namespace["DEVICE"]
        lines = [f"def plan_{plan['entry']}(inputs, symbols):"]
        lines += [f"    S_{n} = symbols[{n!r}]" for n in sorted(self._symbols(plan))]
        flag_head, flag_tail = self._error_flag(plan)
        lines += flag_head
        ins = [names[i] for i in plan["inputs"]]
        if ins:
            lines.append(f"    {', '.join(ins)}, = inputs")
            # a caller that hands over a list gives up its references (a training backward
            # passing what forward saved): the plan's FREE steps then free each input
            lines.append("    if inputs.__class__ is list: inputs.clear()")
        checked: set[int] = set()
        # views of weights (a linear layer's transposed weight) are taken once, here
        folded = {i for i, s in enumerate(slots) if s["kind"] == SlotKind.WEIGHT} \
            if self.static_weights else set()
        for step in plan["steps"]:
            kind = step["kind"]
            if kind == StepKind.FREE:
                dead = [names[i] for i in step["slots"] if i not in folded]
                if dead:   # donated slots stay bound until a kernel reuses them
                    lines.append(f"    del {', '.join(dead)}")
                continue
            if kind == StepKind.KERNEL:
                lines += self._kernel(step, slots, names, weights, checked, folded)
                continue
            if kind not in (StepKind.EXTERN, StepKind.VIEW):
                raise ArtifactError(f"unknown plan step kind {kind!r}", where=plan["entry"],
                                    expected=[k.value for k in StepKind], found=kind,
                                    fix="upgrade aotc or re-export the model")
            args = [decode_arg(a, slot_name, device) for a in step["args"]]
            args += [f"{k}={decode_arg(v, slot_name, device)}" for k, v in step["kwargs"].items()]
            call = self._call(step, args)
            if kind == StepKind.VIEW and len(step["out"]) == 1 and step["out"][0] is not None \
                    and _reads_only(step, folded):
                out = step["out"][0]
                value = eval(call, self.namespace)  # noqa: S307 - source built above
                names[out] = self._global(f"c{out}", value)
                folded.add(out)
                continue
            outs = [names[o] if o is not None else "_" for o in step["out"]]
            target = outs[0] if step.get("single", True) else ", ".join(outs) + ","
            lines.append(f"    {target} = {call}")
        lines += flag_tail
        rets = [names[o["slot"]] if "slot" in o else repr(o["const"]) for o in plan["outputs"]]
        lines.append(f"    return ({', '.join(rets)}{',' if len(rets) == 1 else ''})")
        return "\n".join(lines) + "\n"

    def _call(self, step: dict, args: list[str]) -> str:
        """Source of one ATen call: common views and matmuls through torch's Python bindings
        (about 1 us cheaper per call than an OpOverload), the rest through the overload."""
        op, n = step["op"], len(step["args"])
        method = _METHODS.get(op)
        if method is not None and not step["kwargs"] and n == method[1]:
            return f"{args[0]}.{method[0]}({', '.join(args[1:])})"
        if op in _FUNCTIONS:
            return f"{self._global(_FUNCTIONS[op].__name__, _FUNCTIONS[op])}({', '.join(args)})"
        fn = self._global(op.replace("::", "_"), resolve_op(op))
        return f"{fn}({', '.join(args)})"

    def _kernel(self, step, slots, names, weights, checked, folded=frozenset()) -> list[str]:
        """Lines that allocate a kernel's outputs and call it with data pointers."""
        if self.library is None:
            raise ArtifactError(f"the plan calls kernel {step['name']} but the artifact has no "
                                "kernel library", where=step["name"], expected="kernels/",
                                found="none", fix="re-export the model")
        sizes = step.get("sizes", [])
        launch = step.get("launch")   # a Triton kernel (CUDA artifact): called with tensors
        ptr = (lambda e: e) if launch is not None else (lambda e: f"{e}.data_ptr()")
        fn = self._global(f"k_{step['name']}", self.library.kernel(step["name"])
                          if launch is not None else
                          kernel(self.library, step["name"], len(step["args"]) + len(step["out"]),
                                 len(sizes)))
        lines, ptrs = [], []
        for i in step["args"]:
            s = slots[i]
            if s["kind"] == SlotKind.WEIGHT and self.static_weights:
                w = weights[s["weight"]]
                ptrs.append(self._global(f"p_{s['weight']}",
                                         w if launch is not None else w.data_ptr()))
                continue
            if s["kind"] == SlotKind.WEIGHT:
                ptrs.append(ptr(names[i]))
                continue
            if i in folded:   # a view of weights, taken at load: laid out once, here
                t = _layout(self.namespace[names[i]], tuple(s["stride"]), s.get("contiguous",
                                                                                 False))
                self._global(f"l_{names[i]}", t)   # owns the memory the pointer points to
                ptrs.append(self._global(f"p_{names[i]}", t if launch is not None
                                         else t.data_ptr()))
                continue
            if s.get("producer") != "kernel" and i not in checked:
                checked.add(i)
                contiguous = s.get("contiguous", False)
                lines.append(f"    {names[i]} = layout({names[i]}, {_shape(s['stride'])}, "
                             f"{contiguous})")
            ptrs.append(ptr(names[i]))
        reuse = step.get("reuse", {})
        for o in step["out"]:
            s = slots[o]
            dense = s.get("contiguous", True)   # else a permuted dense layout (channels-last)
            if str(o) in reuse:   # memory planning: take over a dead buffer's storage
                donor = names[reuse[str(o)]]
                same = dense and slots[reuse[str(o)]].get("contiguous", True)
                lines.append(f"    {names[o]} = {donor}.view({_shape(s['shape'])})" if same else
                             f"    {names[o]} = {donor}.as_strided({_shape(s['shape'])}, "
                             f"{_shape(s['stride'])})")
                lines.append(f"    del {donor}")
            elif dense:
                lines.append(f"    {names[o]} = empty({_shape(s['shape'])}, "
                             f"dtype=torch.{s['dtype']}, device=DEVICE)")
            else:
                lines.append(f"    {names[o]} = empty_strided({_shape(s['shape'])}, "
                             f"{_shape(s['stride'])}, dtype=torch.{s['dtype']}, device=DEVICE)")
            ptrs.append(ptr(names[o]))
        if launch is not None:
            return lines + [_launch_line(fn, launch, ptrs, sizes)]
        ptrs += [f"S_{n}" for n in sizes]
        lines.append(f"    if {fn}({', '.join(ptrs)}): kernel_failed({step['name']!r})")
        return lines

    def _error_flag(self, plan) -> tuple[list, list]:
        """Lines that give a plan with index-checking Triton kernels one error flag per call,
        and check it after the last step (runtime/kernels.py)."""
        if not any((s.get("launch") or {}).get("error_code") for s in plan["steps"]):
            return [], []
        self.namespace.update(new_error_flag=self.library.new_error_flag,
                              check_error_flag=self.library.check_error_flag)
        return ["    ERR = new_error_flag()"], ["    check_error_flag(ERR)"]

    @staticmethod
    def _symbols(plan) -> set[str]:
        names = set()
        for s in plan["slots"]:
            for d in s.get("shape", []) + s.get("stride", []):
                if isinstance(d, str):
                    names |= set(re.findall(r"[A-Za-z_]\w*", d)) - {"min", "max"}
        return names

    def __call__(self, inputs, symbols):
        if self.threads is not None:
            self.threads()
        return self.fn(inputs, symbols)


def _launch_line(fn: str, launch: dict, tensors: list, sizes: list) -> str:
    """`k((gx, gy, gz), tensors..., [ERR], sizes...)`: a Triton kernel launch; the grid is
    computed from the size symbols at each call."""
    grid = ", ".join(sym_source(g) for g in launch["grid"])
    args = tensors + (["ERR"] if launch.get("error_code") else []) + [f"S_{n}" for n in sizes]
    return f"    {fn}(({grid}), {', '.join(args)})"
