"""Program: the exporter's output and codegen's input, fully serializable.

A Program holds one captured, decomposed ATen graph as JSON (values with their shapes and dtypes,
nodes naming their ATen overloads, arguments in the plan encoding of `aotc.artifact.encoding`), the
weights, the input guards and the output tree spec, plus the example inputs and eager outputs.
`save`/`load` write it to a directory (program.json + safetensors), so codegen can be run, and a
codegen failure reproduced, from a file.
"""
from __future__ import annotations

import dataclasses
import json
import operator
from dataclasses import dataclass, field
from pathlib import Path

import sympy
import torch
import torch.fx
from safetensors.torch import save_file
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from aotc.errors import ExportError
from aotc.exporter.bindings import bindings, check_assertion
from aotc.exporter.decomp import UNMIRROR
from aotc.exporter.symbols import SymbolNamer, exact_rational
from aotc.artifact.dtypes import dtype_name
from aotc.artifact.encoding import encode_arg
from safetensors.torch import load_file as load_safetensors

# Ops that only assert facts at trace time; they do no work and are dropped.
DROPPED = frozenset({torch.ops.aten._assert_tensor_metadata.default,
                     torch.ops.aten._assert_scalar.default,
                     torch.ops.aten.sym_constrain_range_for_size.default})


@dataclass(frozen=True, kw_only=True)
class Program:
    name: str
    graph: dict                      # {"values", "inputs", "nodes", "outputs"}
    weights: dict[str, torch.Tensor]
    inputs: list[dict]               # guard specs: name, dtype, shape, values
    output_tree: dict
    symbols: dict = field(default_factory=dict)
    relations: list = field(default_factory=list)
    samples: tuple | None = None     # (inputs, flat outputs) from the eager run
    reference: dict | None = None    # flat output position -> its float64 run (reference.py)
    source: str | None = None        # "file.py:Name" when loaded from a file
    options: dict = field(default_factory=dict)
    backward: dict | None = None     # training: the backward graph ...
    training: dict | None = None     # ... and how forward/backward values map to the module
    # generators (exporter/generate.py): entries other than forward, each {"graph", "inputs",
    # "symbols", "output_tree"}; the state they update {name: {"dtype", "shape"}}; and how
    # they are driven (manifest "generation")
    entries: dict | None = None
    state: dict | None = None
    generation: dict | None = None
    state_dict: dict | None = None   # the model's state_dict keys -> the weight each one is
    # tensor-parallel programs (exporter/parallel.py): {"world_size", "sharding": {weight: dim},
    # "ranks": [the weights of ranks 1.., by the names of `weights`]}; `weights` are rank 0's
    tensor_parallel: dict | None = None
    # forward's call signature (exporter/signature.py): [{"name"}, ..., {"name", "default"}]
    parameters: list | None = None
    # --quantize (exporter/quantize.py): the manifest's "quantization" (artifact/schema/quant.py)
    quantization: dict | None = None

    def entry_graphs(self) -> dict[str, dict]:
        """The graph of each entry point, by name: forward (and backward) or the generator's
        entries."""
        if self.entries is not None:
            return {name: e["graph"] for name, e in self.entries.items()}
        graphs = {"forward": self.graph}
        if self.backward is not None:
            graphs["backward"] = self.backward
        return graphs

    def metadata(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("weights", "samples", "reference")}

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "program.json").write_text(json.dumps(self.metadata(), indent=1, sort_keys=True))
        save_file({k: v.contiguous() for k, v in self.weights.items()}, d / "weights.safetensors")
        if self.samples is not None:
            ins, outs = self.samples
            save_file({str(i): t.contiguous() for i, t in enumerate(ins)}, d / "inputs.safetensors")
            save_file({str(i): t.contiguous() for i, t in enumerate(outs)},
                      d / "outputs.safetensors")
        if self.reference is not None:
            save_file({str(i): t.contiguous() for i, t in self.reference.items()},
                      d / "reference.safetensors")
        return d

    @classmethod
    def load(cls, directory: str | Path) -> "Program":
        d = Path(directory)
        meta = json.loads((d / "program.json").read_text())
        samples = None
        if (d / "inputs.safetensors").exists():
            load = lambda f: tuple(v.clone() for _, v in sorted(
                load_safetensors(d / f).items(), key=lambda kv: int(kv[0])))
            samples = (load("inputs.safetensors"), load("outputs.safetensors"))
        ref = d / "reference.safetensors"
        reference = {int(k): v.clone() for k, v in load_safetensors(ref).items()} \
            if ref.exists() else None
        weights = {k: v.clone() for k, v in load_safetensors(d / "weights.safetensors").items()}
        return cls(weights=weights, samples=samples, reference=reference, **meta)


def value_meta(val, namer: SymbolNamer) -> dict | None:
    if isinstance(val, torch.Tensor):
        return {"shape": [_dim(d, namer) for d in val.shape], "dtype": dtype_name(val.dtype),
                "stride": [_dim(s, namer) for s in val.stride()]}
    if isinstance(val, (int, torch.SymInt)):
        return {"int": _dim(val, namer)}
    return None


def _dim(d, namer: SymbolNamer):
    if isinstance(d, int):
        return d
    expr = d.node.expr
    return int(expr) if expr.is_number else namer.expr(expr)


def size_float(node, namer: SymbolNamer) -> float | str:
    """A float computed from sizes (`F.interpolate` divides input sizes by output sizes): its
    value where it is the same for every size (`2*H / H`), else the ratio of two integer size
    expressions as text ("(H - 1) / (2*H - 1)"), which kernels evaluate in float64. Anything
    else (a root, a float power) is an ExportError: plans compute sizes in integers."""
    expr = node.meta["val"].node.expr
    if free_unbacked_symbols(node.meta["val"]):   # zuf0: a tensor's value as a Python float
        trace = node.meta.get("stack_trace")
        raise ExportError("the model reads a tensor's value as a Python float (.item()), which "
                          "plans cannot pass to kernels", where=node_source(trace)
                          or str(node.format_node())[:200],
                          expected="values kept as tensors", found=f"{expr}",
                          fix="keep the value a tensor (x * x.max() instead of "
                              "x * x.max().item())")
    try:
        value = sympy.simplify(exact_rational(expr))
    except ExportError:   # a factor with no exact small fraction: refused below
        value = sympy.nan
    num, den = sympy.fraction(sympy.together(value))
    if value.is_number and value.is_finite:
        return float(value)
    if num.is_integer and den.is_integer:
        return f"({namer.expr(sympy.expand(num))}) / ({namer.expr(sympy.expand(den))})"
    trace = node.meta.get("stack_trace")
    raise ExportError("the model computes a float from a dynamic size that kernels cannot "
                      "compute", where=node_source(trace)
                      or str(node.format_node())[:200], expected="integer arithmetic on sizes, "
                      "or a ratio of two", found=f"{expr}",
                      fix="compute with the size as a tensor (torch.tensor(x.shape[-1])) or in "
                          "integers, or export this dim static")


def _is_symint_node(node) -> bool:
    return isinstance(node.meta.get("val"), (torch.SymInt, int)) and not isinstance(
        node.meta.get("val"), bool) and node.op == "call_function"


def graph_to_json(gm: torch.fx.GraphModule, placeholders: list[dict],
                  namer: SymbolNamer | None = None, *, value_sizes: bool = False) -> dict:
    """Convert a traced ATen graph. `placeholders` describes each placeholder in order;
    `namer` names the symbolic sizes of a dynamic-shape graph. `value_sizes`: sizes that
    depend on tensor values are bound by the call that makes them (exporter/bindings.py);
    without, they are an ExportError. The graph's "bound" maps each such symbol to its range."""
    namer = namer or SymbolNamer()
    values, ids, nodes, inputs, syms, bound = [], {}, [], [], {}, {}

    def new(val) -> int:
        values.append(value_meta(val, namer))
        return len(values) - 1

    def slot_of(node):
        if node in syms:
            return syms[node] if isinstance(syms[node], float) else {"sym": syms[node]}
        return {"slot": ids[node]}
    phs = iter(placeholders)
    for node in gm.graph.nodes:
        if node.op == "call_function" and _is_symint_node(node) and (
                node.target is torch.ops.aten.sym_size.int
                or not isinstance(node.target, torch._ops.OpOverload)):
            syms[node] = _dim(node.meta["val"], namer)   # size arithmetic: an expression
            continue
        if node.op == "call_function" and isinstance(node.meta.get("val"), torch.SymFloat):
            syms[node] = size_float(node, namer)   # a ratio of sizes
            continue
        if _asserted_only(node):   # a comparison that an assertion checks (below)
            continue
        if node.op == "placeholder":
            ids[node] = new(node.meta.get("val"))
            inputs.append(dict(next(phs), value=ids[node]))
        elif node.op == "call_function" and node.target is operator.getitem:
            ids[node] = ids[(node.args[0], node.args[1])]
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target in DROPPED:
                if node.target is torch.ops.aten._assert_scalar.default:
                    check_assertion(node)
                continue
            binds = bindings(node, namer, bound, value_sizes)
            nodes.append(_node_json(node, ids, new, slot_of))
            if binds:
                nodes[-1]["binds"] = binds
        elif node.op == "output":
            outs = node.args[0]
            outputs = [slot_of(o) if isinstance(o, torch.fx.Node) else {"const": o}
                       for o in outs]
        else:
            raise ExportError(f"the captured graph holds a {node.op} node {node.target}, which "
                              "aotc cannot place in a plan", where=str(node.format_node()),
                              expected="ATen operator calls", found=str(node.target),
                              fix="remove the construct from forward (control-flow operators and "
                                  "Python callables are not supported yet)")
    out = {"values": values, "inputs": inputs, "nodes": nodes, "outputs": outputs}
    return dict(out, bound=bound) if bound else out


def _asserted_only(node) -> bool:
    """A comparison of sizes (`u0 <= 16`) read only by assertions."""
    return (node.op == "call_function" and isinstance(node.meta.get("val"), torch.SymBool)
            and bool(node.users) and all(u.target is torch.ops.aten._assert_scalar.default
                                         for u in node.users))


def _node_json(node, ids, new, slot_of) -> dict:
    target = UNMIRROR.get(node.target, node.target)
    args, kwargs = node.args, node.kwargs
    if target is not node.target:
        args, kwargs = _rebind(node.target, target, args, kwargs)
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        out = []
        for i, v in enumerate(val):
            ids[(node, i)] = new(v)
            out.append(ids[(node, i)])
        single = False
    else:
        ids[node] = new(val)
        out, single = [ids[node]], True
    out = {"op": f"{target._schema.name}.{target._overloadname}",
           "args": [encode_arg(a, slot_of) for a in args],
           "kwargs": {k: encode_arg(v, slot_of) for k, v in kwargs.items()},
           "out": out, "single": single}
    source = user_frame(node.meta.get("stack_trace"))
    if source:
        out["source"] = source
    return out


def user_frame(stack_trace: str | None, libraries: bool = False) -> str | None:
    """'file.py:line: code' of the innermost frame of the model's own code in an FX node's
    stack trace (torch's and aotc's frames skipped; with `libraries`, any frame), or None. The
    file's name only: artifacts are reproducible byte for byte wherever the model's file lies."""
    from aotc.exporter.capture import _FRAME, _is_library
    frames = [(f, int(n)) for f, n in _FRAME.findall(stack_trace or "")
              if libraries or not _is_library(f)]
    if not frames:
        return None
    import linecache
    file, line = frames[-1]
    return f"{Path(file).name}:{line}: {linecache.getline(file, line).strip()}"[:512]


def node_source(stack_trace: str | None) -> str | None:
    """Where an FX node came from, for its errors: the innermost frame outside torch, the
    standard library and aotc (a library's line, as transformers' modeling file, or the
    model's own), then the model's own innermost line where that is another one
    ("... (called from model.py:12: ...)"); None without a stack trace."""
    from aotc.exporter.capture import _FRAME, _LIBRARY_DIRS
    outside = [(f, int(n)) for f, n in _FRAME.findall(stack_trace or "")
               if not (f.startswith("<") or "/torch/" in f or f.startswith(_LIBRARY_DIRS)
                       and "site-packages" not in f)]
    own = user_frame(stack_trace)
    if not outside:
        return own or user_frame(stack_trace, libraries=True)
    import linecache
    file, line = outside[-1]
    inner = f"{Path(file).name}:{line}: {linecache.getline(file, line).strip()}"[:400]
    return inner if own is None or own == inner else f"{inner} (called from {own})"[:512]


def _rebind(src, dst, args, kwargs) -> tuple[tuple, dict]:
    """Map a call of `src` onto `dst`'s schema by argument name (mirror ops -> ATen)."""
    named = dict(zip((a.name for a in src._schema.arguments), args), **kwargs)
    pos = []
    for a in dst._schema.arguments:
        if a.kwarg_only or a.name not in named:
            break
        pos.append(named.pop(a.name))
    return tuple(pos), named
