"""Stage 1, capture: an nn.Module and example inputs in, a `Program` out.

    eager run (output structure, reference outputs)
      -> torch.export, strict (Dynamo fullgraph capture; failures become ExportErrors)
      -> aotc's decomposition (functional core ATen, `exporter/decomp.py`)
      -> Program (JSON graph, weights, guards, output tree spec, samples)
"""
from __future__ import annotations

import inspect
from functools import partial
from pathlib import Path

import torch

from aotc.errors import ExportError, UsageError
from aotc.exporter.capture import capture, captured, locate
from aotc.exporter.complex import real_view, refuse as refuse_complex
from aotc.exporter.decomp import decompose
from aotc.exporter.outputs import FlatOutputs, follow, tree_spec
from aotc.exporter.program import Program, graph_to_json
from aotc.exporter.reference import float64_reference
from aotc.exporter.signature import call_parameters
from aotc.exporter.state import state_keys
from aotc.exporter.symbols import SymbolNamer
from aotc.options import ExportOptions
from aotc.artifact.dtypes import dtype_name

__all__ = ["export", "Program"]


def export(model: torch.nn.Module, example_inputs: tuple, options: ExportOptions = ExportOptions(),
           *, source: str | None = None, value_ranges: list | None = None,
           dynamic_shapes=None) -> Program:
    """Capture `model` called on `example_inputs` into a Program (inference: eval mode).
    `dynamic_shapes` is torch.export's: Dims per input dim, by position or argument name."""
    args = _check_inputs(example_inputs)
    names = _input_names(model, len(args))
    dyn = normalize_dynamic_shapes(dynamic_shapes, names, args)
    src_file = Path(source.rpartition(":")[0]) if source else _source_file(model)
    model.eval()
    with torch.no_grad():
        try:
            eager = model(*args)
        except Exception as e:
            raise ExportError(f"the model failed on the example inputs: {type(e).__name__}: {e}",
                              where=locate(e, src_file) or "model forward",
                              expected="a forward pass that runs eagerly on the example inputs",
                              found=type(e).__name__,
                              fix="check the --example-input shapes and dtypes against what "
                                  "the model expects") from e
    spec, paths = tree_spec(eager)
    flat_out = tuple(follow(eager, p).detach() for p in paths)
    notes: list[str] = []
    ep = capture(FlatOutputs(model, paths), args, strict=options.strict, source=src_file,
                 dynamic_shapes=(dyn,) if dyn is not None else None, notes=notes)
    _refuse_mutations(ep)
    flat_args, placeholders, weights = _flatten_inputs(ep, args, names)
    namer, symbols = name_symbols(ep, dyn, args)
    if dyn is not None:   # trace with export's symbolic inputs, so sizes stay symbolic
        flat_args = [real_view(n.meta["val"]) for n in _placeholders(ep)]
    graph = graph_to_json(decompose(ep.graph_module, flat_args, symbolic=dyn is not None),
                          placeholders, namer, value_sizes=True)
    symbols.update(graph.pop("bound", {}))   # value-dependent sizes, bound by plan steps
    user = [i for i in graph["inputs"] if i["kind"] == "input"]
    inputs = [{"name": ph["name"], "dtype": dtype_name(a.dtype),
               "shape": graph["values"][ph["value"]]["shape"],
               "values": _value_range(a, (value_ranges or [None] * len(args))[i])}
              for i, (ph, a) in enumerate(zip(user, args))]
    _refuse_specialized(dyn, inputs)
    state, unread = state_keys(model, weights)
    return Program(name=options.name or type(model).__name__, graph=graph,
                   weights={**weights, **unread}, inputs=inputs, output_tree=spec,
                   symbols=symbols, samples=(args, flat_out) if options.record_samples else None,
                   reference=float64_reference(model, args, paths, flat_out)
                   if options.record_samples and options.prove else None,
                   source=source, options={**options.to_json(), **captured(notes)},
                   state_dict=state, parameters=call_parameters(model, len(args)))


def normalize_dynamic_shapes(dynamic_shapes, names: list[str], args: tuple):
    """torch.export dynamic shapes, positional (by forward's argument names if a dict), with
    example sizes checked: a dynamic dim needs an example size of at least 2."""
    if dynamic_shapes is None:
        return None
    if isinstance(dynamic_shapes, dict):
        unknown = sorted(set(dynamic_shapes) - set(names))
        if unknown:
            raise UsageError(f"dynamic_shapes names unknown inputs {unknown}",
                             where="dynamic_shapes", expected=names, found=unknown,
                             fix="key dynamic_shapes by forward's argument names, or pass a "
                                 "tuple by position")
        dynamic_shapes = [dynamic_shapes.get(n) for n in names]
    dyn = tuple(dynamic_shapes)
    if len(dyn) != len(args):
        raise UsageError("dynamic_shapes has the wrong number of entries", where="dynamic_shapes",
                         expected=len(args), found=len(dyn), fix="give one entry per input")
    for i, (spec, a) in enumerate(zip(dyn, args)):
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for d, dim in items:
            if dim is not None and hasattr(dim, "__name__") and a.shape[d] < 2:
                raise UsageError(f"input {names[i]!r} dim {d} is dynamic ({dim.__name__}) but "
                                 f"its example size is {a.shape[d]}",
                                 where=f"input {names[i]!r}, dim {d}", expected="size >= 2",
                                 found=a.shape[d],
                                 fix="export with an example size of 2 or more; torch.export "
                                     "specializes sizes 0 and 1 (the range may include 1)")
    return dyn


def _refuse_specialized(dyn, inputs: list[dict]) -> None:
    """An ExportError for a dim declared dynamic that the traced code fixed to one size (the
    graph's input shape holds a number there): the artifact would refuse every other size."""
    for spec, inp in zip(dyn or (), inputs):
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for d, dim in items:
            if hasattr(dim, "__name__") and isinstance(inp["shape"][d], int):
                raise ExportError(f"input {inp['name']!r} dim {d} was declared dynamic "
                                  f"({dim.__name__}) but the traced code fixed it to "
                                  f"{inp['shape'][d]}", where=f"input {inp['name']!r}, dim {d}",
                                  expected=f"a size that stays symbolic ({dim.__name__})",
                                  found=inp["shape"][d], fix="find the computation that turns "
                                  "this size into a Python number (float math on x.shape, "
                                  "int(...)) and keep it in integer size arithmetic, or export "
                                  "the dim static")


def _placeholders(ep):
    return [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]


def name_symbols(ep, dyn, args) -> tuple[SymbolNamer, dict]:
    """Export's shape symbols renamed to the user's dim names, with their ranges and the
    example sizes they were exported with."""
    if dyn is None:
        return SymbolNamer(), {}
    user = [n for n, s in zip(_placeholders(ep), ep.graph_signature.input_specs)
            if s.kind.name == "USER_INPUT"]
    names, examples = {}, {}
    for node, spec, a in zip(user, dyn, args):
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for d, dim in items:
            expr = node.meta["val"].shape[d]
            if dim is not None and isinstance(expr, torch.SymInt) and expr.node.expr.is_Symbol:
                names[expr.node.expr] = dim.__name__
                examples[dim.__name__] = int(a.shape[d])
    symbols = {}
    for sym, vr in ep.range_constraints.items():
        if sym in names:
            hi = vr.upper
            symbols[names[sym]] = {"min": int(vr.lower), "example": examples[names[sym]],
                                   "max": int(hi) if getattr(hi, "is_finite", True) and
                                   str(hi) not in ("oo", "int_oo") else 2**62}
    return SymbolNamer(names), symbols


def _check_inputs(example_inputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args = tuple(example_inputs)
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise UsageError(f"example input #{i} is a {type(a).__name__}, not a tensor",
                             where=f"example_inputs[{i}]", expected="torch.Tensor",
                             found=type(a).__name__, fix="pass a tuple of example tensors")
    return args


def _source_file(model) -> Path | None:
    """The file defining the model's class; None for one defined where no file holds it (a
    notebook, `python -c`, a REPL) or built in."""
    try:
        return Path(inspect.getsourcefile(type(model)))
    except (TypeError, OSError):
        return None


def _input_names(model, n: int) -> list[str]:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"input{i}" for i in range(n)]


def _value_range(t: torch.Tensor, declared):
    if declared is not None:
        return list(declared)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool or t.numel() == 0:
        return None
    return [int(t.min()), int(t.max())]


def _refuse_mutations(ep) -> None:
    for spec in ep.graph_signature.output_specs:
        if spec.kind.name != "USER_OUTPUT":
            raise ExportError(f"the model's forward mutates {spec.target} ({spec.kind.name})",
                              where=str(spec.target), expected="no buffer or input mutation "
                              "in an inference forward", found=spec.kind.name,
                              fix="do not update buffers or inputs in place in eval mode")


def _flatten_inputs(ep, args, names):
    """Real values for every placeholder of the exported graph, and what each one is."""
    flat, placeholders, weights = [], [], {}
    user = iter(zip(args, names))
    for spec in ep.graph_signature.input_specs:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            value, name = next(user)
            refuse_complex(value, f"input {name!r}", name)
            placeholders.append({"kind": "input", "name": name})
        elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            value = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
            # artifacts store weights contiguous, and complex ones as real pairs
            value = real_view(value.detach()).contiguous()
            name = spec.target.removeprefix("m.")
            weights[name] = value.detach()
            placeholders.append({"kind": "weight", "name": name})
        else:
            raise ExportError(f"the model takes a {kind} input ({spec.target}) aotc cannot store",
                              where=str(spec.target), expected="tensors", found=kind,
                              fix="replace custom objects with tensors")
        flat.append(value)
    return flat, placeholders, weights


def export_training(model: torch.nn.Module, example_inputs: tuple,
                    options: ExportOptions = ExportOptions(), *, source: str | None = None,
                    value_ranges: list | None = None) -> Program:
    """Capture one training step of `model` (forward and precomputed backward) into a Program."""
    from aotc.exporter.train import capture_training, training_graphs
    args = _check_inputs(example_inputs)
    src_file = Path(source.rpartition(":")[0]) if source else _source_file(model)
    names = _input_names(model, len(args))
    notes: list[str] = []
    try:
        fw, bw, spec, meta, leaves = capture_training(model, args, strict=options.strict,
                                                      source=src_file,
                                                      capture=partial(capture, notes=notes))
    except ExportError:
        raise
    except Exception as e:
        sized = type(e).__name__ in ("DynamicOutputShapeException", "DataDependentOutputException")
        raise ExportError(f"capturing the training step failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:300] if str(e) else ''}",
                          where=locate(e, src_file) or "model forward/backward",
                          expected="a forward AOTAutograd can differentiate",
                          found=type(e).__name__,
                          fix="training steps need sizes that follow from the inputs' sizes "
                              "(value-dependent sizes, x[mask] or nonzero, export for "
                              "inference only): select with torch.where instead" if sized
                          else "check the model trains eagerly") from e
    fgraph, bgraph, finputs, binputs = training_graphs(fw, bw, meta, args)
    for spec_in, name, a, rng in zip(finputs, names, args, value_ranges or [None] * len(args)):
        spec_in.update(name=name, values=_value_range(a, rng))
    for ph, name in zip([i for i in fgraph["inputs"] if i["kind"] == "input"], names):
        ph["name"] = name
    weights = {n: t.detach().contiguous() for n, t in
               list(model.named_parameters()) + list(model.named_buffers())}
    meta["backward_inputs"] = binputs
    state, unread = state_keys(model, weights)
    return Program(name=options.name or type(model).__name__, graph=fgraph,
                   weights={**weights, **unread}, inputs=finputs, output_tree=spec,
                   backward=bgraph, training=meta, samples=None, source=source,
                   options={**options.to_json(), **captured(notes)}, state_dict=state,
                   parameters=call_parameters(model, len(args)))


def trace_function(fn, example_inputs: tuple, name: str = "fn") -> Program:
    """A Program for a plain function of tensors, traced without Dynamo (make_fx + aotc's
    decomposition). For tests and tools that exercise codegen op by op (OpInfo samples);
    models go through `export`."""
    args = _check_inputs(example_inputs)
    with torch.no_grad():
        eager = fn(*args)
    spec, paths = tree_spec(eager)
    flat_out = tuple(follow(eager, p).detach() for p in paths)
    def flat_fn(*a):   # one call of fn, then its leaves (not one traced call per output)
        out = fn(*a)
        return tuple(follow(out, p) for p in paths)
    placeholders = [{"kind": "input", "name": f"input{i}"} for i in range(len(args))]
    gm = torch.fx.experimental.proxy_tensor.make_fx(flat_fn)(*args)
    gm, constants = _lift_constants(decompose(gm, list(args)))
    placeholders += [{"kind": "weight", "name": n} for n in constants]
    graph = graph_to_json(gm, placeholders)
    inputs = [{"name": f"input{i}", "dtype": dtype_name(a.dtype), "shape": list(a.shape),
               "values": _value_range(a, None)} for i, a in enumerate(args)]
    return Program(name=name, graph=graph, weights=constants, inputs=inputs, output_tree=spec,
                   samples=(args, flat_out), options={})


def _lift_constants(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict]:
    """The tensor constants make_fx keeps as attributes (`x[[0, 2]]` traces the list as one)
    as placeholders after the inputs, each a weight of the program: {name: tensor}."""
    constants = {}
    last = [n for n in gm.graph.nodes if n.op == "placeholder"][-1:]
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        name = f"constant.{node.target}"
        with gm.graph.inserting_after(last[0]) if last else \
                gm.graph.inserting_before(next(iter(gm.graph.nodes))):
            ph = gm.graph.placeholder(name.replace(".", "_"))
        ph.meta["val"] = value
        node.replace_all_uses_with(ph)
        gm.graph.erase_node(node)
        last = [ph]
        constants[name] = value.detach().clone()
    gm.recompile()
    return gm, constants
