"""Readable text for codegen's stages: ATen graphs, the loop IR (realized nodes and their
bodies, kernels), and plans (slots and steps). What `--dump-passes` writes (codegen/dump.py).

A node's body is printed by running it with `IRPrinter`, an ops handler (ir.NullHandler's
protocol) that names each value it computes, one line each:

    buf4: float32[batch, 16] = pointwise (x0 < batch, x1 < 16)  [add+relu]
      t0 = load buf2[16*x0 + x1]
      t1 = add(t0, 1.0)
      t2 = relu(t1)
      store t2
"""
from __future__ import annotations

import json

import sympy
from sympy.printing.str import StrPrinter

from aotc.artifact.dtypes import dtype_name
from aotc.codegen.ir import ComputedBuffer, Reduction, index_vars


class _IndexPrinter(StrPrinter):
    """sympy's printing with the loop IR's integer division and modulo as Python's."""

    def _print_FloorDiv(self, e):
        return f"({self._print(e.args[0])} // {self._print(e.args[1])})"

    def _print_ModIndex(self, e):
        return f"({self._print(e.args[0])} % {self._print(e.args[1])})"


def expr_text(e) -> str:
    """An index or size expression: `64*x0 + x1`, `(x0 // 4)`, `seq - 3`."""
    if isinstance(e, (int, str)):
        return str(e)
    return _IndexPrinter().doprint(e)


def dims_text(dims) -> str:
    return "[" + ", ".join(expr_text(d) for d in dims) + "]"


def _dtype(dtype) -> str:
    return dtype if isinstance(dtype, str) else dtype_name(dtype)


class IRPrinter:
    """An ops handler that prints a body as lines `tN = op(args)`: loads with their index
    expressions, constants inline, masked regions indented under their mask."""

    def __init__(self, indent: str = "  "):
        self.lines: list[str] = []
        self.indent = indent
        self.count = 0
        self.indirects = 0

    def _name(self) -> str:
        self.count += 1
        return f"t{self.count - 1}"

    def _emit(self, text: str) -> str:
        name = self._name()
        self.lines.append(f"{self.indent}{name} = {text}")
        return name

    def load(self, name, index):
        return self._emit(f"load {name}[{expr_text(sympy.sympify(index))}]")

    def constant(self, value, dtype):
        return f"{value!r}"

    def index_expr(self, expr, dtype):
        return self._emit(f"index {expr_text(sympy.sympify(expr))} as {_dtype(dtype)}")

    def to_dtype(self, x, dtype):
        return self._emit(f"to {_dtype(dtype)}({x})")

    def op(self, op, *args):
        return self._emit(f"{op.value}({', '.join(map(str, args))})")

    def masked(self, mask, fn, other, dtype):
        name = self._name()
        self.lines.append(f"{self.indent}{name} = where {mask} else {other} {{")
        outer, self.indent = self.indent, self.indent + "  "
        value = fn()
        self.lines.append(f"{self.indent}yield {value}")
        self.indent = outer
        self.lines.append(f"{self.indent}}}")
        return name

    def indirect(self, value, size, wraps=True, op="aten::index.Tensor"):
        symbol = sympy.Symbol(f"ind{self.indirects}", integer=True)
        self.indirects += 1
        how = "negatives wrap" if wraps else "negatives refused"
        self.lines.append(f"{self.indent}{symbol} = indirect {value} in [0, "
                          f"{expr_text(sympy.sympify(size))}) ({how}; {op})")
        return symbol

    def bounded_index(self, expr, size):
        return expr


def buffer_text(buf) -> str:
    """`buf3: float32[batch, 64] stride [64, 1]` (constant: a weight or a view of one)."""
    text = f"{buf.name}: {_dtype(buf.dtype)}{dims_text(buf.shape)} stride {dims_text(buf.stride)}"
    return text + (" constant" if buf.constant else "")


def node_text(node: ComputedBuffer, indent: str = "") -> str:
    """A realized node: its buffers, iteration space, reduction, the ATen ops it came from,
    and its body, one value a line."""
    body = node.body
    xs = index_vars("x", len(body.ranges))
    space = ", ".join(f"{v} < {expr_text(n)}" for v, n in zip(xs, body.ranges))
    names = ", ".join(f"{b.name}: {_dtype(b.dtype)}{dims_text(b.shape)}" for b in node.buffers)
    p = IRPrinter(indent + "  ")
    if isinstance(body, Reduction):
        rs = index_vars("r", len(body.reduction_ranges))
        over = ", ".join(f"{v} < {expr_text(n)}" for v, n in zip(rs, body.reduction_ranges))
        head = f"{body.reduction_type.value} reduction ({space}) over ({over})"
        if body.output_index:
            head += f" output {body.output_index}"
        value = body.inner_fn(p, xs, rs)
        last = f"reduce {value}"
    else:
        head = f"pointwise ({space})"
        value = body.inner_fn(p, xs)
        last = f"store {value}"
    origins = f"  [{'+'.join(body.origins)}]" if body.origins else ""
    return "\n".join([f"{indent}{names} = {head}{origins}", *p.lines, f"{indent}  {last}"])


def kernel_text(kernel) -> str:
    """A scheduled kernel (scheduler.Kernel): its rows, the buffers kept in registers, the
    reasons for its fusion decisions and each node's loop IR."""
    if hasattr(kernel, "ins"):   # written by hand (triton/decode_attention.py's HandKernel)
        lines = [f"kernel {kernel.name} (hand-written): reads "
                 f"{', '.join(b.name for b in kernel.ins) or '-'}; writes "
                 f"{', '.join(b.name for b in kernel.outs)}"]
    else:
        lines = [f"kernel {kernel.name}: rows {dims_text(kernel.prefix)}, {len(kernel.nodes)} "
                 f"node{'s' if len(kernel.nodes) != 1 else ''}"
                 + (f", in registers: {', '.join(sorted(kernel.local))}" if kernel.local
                    else "")]
    lines += [f"  # {reason}" for reason in kernel.reasons]
    lines += [node_text(n, "  ") for n in kernel.nodes]
    return "\n".join(lines)


def _doc(x):
    """A typed plan record (artifact/schema/plan.py: slot, step, output) as plans store it."""
    return x.to_json() if hasattr(x, "to_json") else x


def arg_text(a) -> str:
    """A plan or graph argument: slots as %N, lists in brackets, other values as JSON."""
    a = _doc(a)
    if isinstance(a, dict) and set(a) == {"slot"}:
        return f"%{a['slot']}"
    if isinstance(a, list):
        return "[" + ", ".join(arg_text(x) for x in a) + "]"
    return json.dumps(a, sort_keys=True)


def _outs(out) -> str:
    return ", ".join("_" if o is None else f"%{o}" for o in out)


SHOWN = {"kind", "op", "args", "kwargs", "out", "name", "sizes", "slots", "source", "fused",
         "reasons", "single"}


def step_text(step) -> str:
    """One plan step (typed, or a dict as plans store them), or a realized node or a kernel a
    lowering made whole (a hand-written one) of a lowered graph."""
    if isinstance(step, ComputedBuffer):
        return node_text(step)
    if hasattr(step, "prefix"):
        return kernel_text(step)
    step = _doc(step)
    kind = step["kind"]
    if kind == "free":
        return f"free {', '.join(f'%{s}' for s in step['slots'])}"
    if kind == "kernel":
        call = f"kernel {step['name']}({', '.join(f'%{s}' for s in step['args'])})"
        call += f" sizes {dims_text(step.get('sizes', []))}"
    else:
        args = [arg_text(a) for a in step.get("args", [])]
        args += [f"{k}={arg_text(v)}" for k, v in sorted(step.get("kwargs", {}).items())]
        call = f"{kind} {step.get('op')}({', '.join(args)})"
    text = f"{_outs(step.get('out', []))} = {call}"
    rest = {k: v for k, v in step.items() if k not in SHOWN}
    if rest:
        text += " " + " ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in rest.items())
    for part in step.get("fused", []):
        text += f"\n      fuses {', '.join(part['buffers'])} ({'+'.join(part['ops'])})"
    if step.get("source"):
        text += f"\n      # {step['source']}"
    return text


def slot_text(slot) -> str:
    """`%3 weight fc1.weight: float32[256, 64] stride [1, 256] transposed`."""
    slot = _doc(slot)
    kind = slot.get("kind", "value")
    name = slot.get("weight") or slot.get("name") or slot.get("state") or ""
    text = f"%{slot['id']} {kind}{' ' + name if name else ''}"
    if "shape" in slot:
        text += f": {slot['dtype']}{dims_text(slot['shape'])} stride {dims_text(slot['stride'])}"
    rest = {k: v for k, v in slot.items()
            if k not in ("id", "kind", "weight", "name", "state", "shape", "stride", "dtype")}
    return text + "".join(f" {k}={json.dumps(v, sort_keys=True)}" for k, v in rest.items())


def steps_text(steps) -> list[str]:
    width = len(str(max(len(steps) - 1, 0)))
    return [f"{i:>{width}}  {step_text(s)}".replace("\n", "\n" + " " * (width + 2))
            for i, s in enumerate(steps)]


def plan_text(plan: dict) -> str:
    """A plan as stored (plans/<entry>.json, or a typed Plan's to_json()): its inputs and
    outputs, slots, steps in order, and statistics."""
    lines = [f"plan {plan.get('entry', '?')}",
             f"inputs: {', '.join(f'%{s}' for s in plan['inputs'])}",
             f"outputs: {', '.join(arg_text(o) for o in plan['outputs'])}", "", "slots:"]
    lines += ["  " + slot_text(s) for s in plan["slots"]]
    lines += ["", "steps:"] + ["  " + s for s in steps_text(plan["steps"])]
    stats = plan.get("stats")
    if stats:
        lines += ["", "stats:"] + [f"  {k}: {json.dumps(v, sort_keys=True)}"
                                   for k, v in stats.items() if k != "fusion"]
        lines += [f"  fusion: {d}" for d in stats.get("fusion", [])]
    return "\n".join(lines) + "\n"


def lowered_text(lowered) -> str:
    """A lowered graph (graph.LoweredGraph): its slots, then its steps in order: extern and
    view steps, and realized loop-IR nodes."""
    inputs = (arg_text(i) if isinstance(i, dict) else f"%{i}" for i in lowered.inputs)
    lines = [f"inputs: {', '.join(inputs)}",
             f"outputs: {', '.join(arg_text(o) for o in lowered.outputs)}", "", "slots:"]
    lines += ["  " + slot_text(s) for s in lowered.slots]
    lines += ["", "steps:"] + ["  " + s for s in steps_text(lowered.steps)]
    lines += ["", f"lowered: {json.dumps(dict(sorted(lowered.lowered.items())))}",
              f"fallback: {json.dumps(dict(sorted(lowered.fallback.items())))}"]
    if lowered.rewrites:
        lines.append(f"rewrites: {json.dumps(lowered.rewrites, sort_keys=True)}")
    return "\n".join(lines) + "\n"


def scheduled_text(steps: list, decisions: list) -> str:
    """Scheduled steps: kernels (with their nodes' loop IR) and extern steps, in order, then
    every fusion decision with its reason."""
    lines = []
    for i, s in enumerate(steps):
        text = kernel_text(s) if hasattr(s, "prefix") else step_text(s)
        lines.append(f"{i}  " + text.replace("\n", "\n   "))
    lines += ["", "decisions:"] + [f"  {d}" for d in decisions]
    return "\n".join(lines) + "\n"


def graph_text(graph: dict) -> str:
    """An ATen graph as the exporter writes it (values, inputs, nodes, outputs)."""
    values = graph["values"]

    def value(i):
        v = values[i]
        return f"%{i}: {v['dtype']}{dims_text(v['shape'])}" if "shape" in v else f"%{i}"
    lines = ["inputs:"]
    lines += [f"  {value(i['value'])} {i.get('kind', 'input')} {i.get('name', '')}".rstrip()
              for i in graph["inputs"]]
    lines += ["", "nodes:"]
    for node in graph["nodes"]:
        args = [arg_text(a) for a in node.get("args", [])]
        args += [f"{k}={arg_text(v)}" for k, v in sorted(node.get("kwargs", {}).items())]
        outs = ", ".join("_" if o is None else value(o) for o in node.get("out", []))
        extra = "  (writes back state)" if node.get("writeback") else ""
        lines.append(f"  {outs} = {node['op']}({', '.join(args)}){extra}")
    lines += ["", f"outputs: {', '.join(arg_text(o) for o in graph['outputs'])}"]
    return "\n".join(lines) + "\n"
