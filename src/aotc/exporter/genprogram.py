"""A generator's two captured entries as one Program (exporter/generate.py drives this).

Each entry is captured by torch.export on its own step module and decomposed as a forward is;
the weights they read are stored once under the decoder's own names, and the buffers they
update (the caches and the position) become the Program's state, which the graphs read as
inputs and write back with `copy_` (codegen/state.py turns the cache writes into in-place
updates of just the new positions).
"""
from __future__ import annotations


import torch

from aotc.exporter.capture import capture, captured
from aotc.exporter.decomp import decompose
from aotc.exporter.outputs import ITEM, FlatOutputs
from aotc.exporter.program import Program, graph_to_json
from aotc.exporter.state import state_keys
from aotc.nn import set_mode
from aotc.artifact.dtypes import dtype_name

PROMPT = "prompt"
TOKEN = 1       # the entries' flat output holding the greedy token (generate.py PrefillStep)


def build_program(g, ids: torch.Tensor, options, *, src_file, source, value_ranges,
                  samples: torch.Tensor) -> Program:
    from aotc.exporter.generate import reset_state, state_buffers
    from aotc.exporter.hf_decoder import HFDecoder
    states = {f"g.{n}": t for n, t in state_buffers(g).items()}
    strip = "g.decoder.model." if isinstance(g.decoder, HFDecoder) else "g.decoder."
    values = (value_ranges or [None])[0]
    entries, weights, notes = {}, {}, []
    batch, max_len = ids.shape[0], g.max_cache_len
    for name, step, examples, dyn in _steps(g, ids):
        set_mode(g, name.partition("_")[0])          # decode_K: a decode bucket
        reset_state(g)
        entry, w = _capture_entry(step, examples, dyn, options, src_file, states, strip, values,
                                  notes)
        entries[name] = entry
        weights.update(w)
    set_mode(g, "eager")
    state = {n.removeprefix("g."): {"dtype": dtype_name(t.dtype), "shape": list(t.shape)}
             for n, t in states.items()}
    vocab = int(entries["decode"]["output_meta"]["shape"][-1])
    generation = {"prefill": "prefill", "decode": "decode", "position": "pos",
                  "max_cache_len": max_len, "batch": g.slots or batch, "vocab": vocab,
                  "token": TOKEN, **({"slots": g.slots} if g.slots else {}),
                  **({"buckets": [{"rows": k, "entry": f"decode_{k}"} for k in g.buckets]}
                     if g.buckets else {})}
    first = entries["prefill"]
    owner = g.decoder.model if isinstance(g.decoder, HFDecoder) else g.decoder
    state_dict, unread = state_keys(owner, weights)   # stored names are the model's own
    return Program(name=options.name or type(g.decoder).__name__, graph=first["graph"],
                   weights={**weights, **unread}, state_dict=state_dict, inputs=first["inputs"], output_tree=first["output_tree"],
                   symbols=first["symbols"], samples=((ids,), (samples,))
                   if options.record_samples else None, source=source,
                   options={**options.to_json(), **captured(notes)}, entries=entries, state=state,
                   generation=generation)


def _steps(g, ids: torch.Tensor):
    """(entry name, step module, example inputs, dynamic shapes) of each entry: prefill with a
    dynamic prompt length, decode static (module doc of exporter/generate.py)."""
    from aotc.exporter.generate import (DecodeStep, PrefillStep, SlotDecodeStep,
                                        SlotPrefillStep)
    prompt = {1: torch.export.Dim(PROMPT, min=1, max=g.max_cache_len - 1)}
    if not g.slots:
        return (("prefill", PrefillStep(g, token=True), (ids,), (prompt,)),
                ("decode", DecodeStep(g, token=True), (ids[:, :1],), None))
    slot, start = ids.new_zeros(1), ids.new_zeros(1)    # two tensors: two inputs
    buckets = tuple((f"decode_{k}", SlotDecodeStep(g, token=True, rows=k),
                     (ids[:1, :1].repeat(k, 1),), None) for k in g.buckets)
    return (("prefill", SlotPrefillStep(g, token=True), (ids[:1], slot, start),
             (prompt, None, None)),
            ("decode", SlotDecodeStep(g, token=True), (ids[:1, :1].repeat(g.slots, 1),), None),
            *buckets)


SLOT_INPUTS = ("input_ids", "slot", "start")    # a slot prefill's inputs, in order


def _capture_entry(step, examples, dyn, options, src_file, states, strip, values, notes):
    """One entry: its Program entry dict and the weights it reads (by stored name); how it was
    captured, where not as asked, appended to `notes`."""
    from aotc.exporter import _flatten_inputs, name_symbols
    from aotc.exporter.complex import real_view
    # the caches' in-place writes draw torch's side-effects warning, which capture filters
    ep = capture(FlatOutputs(step, [((ITEM, 0),), ((ITEM, TOKEN),)]), examples,
                 strict=options.strict,
                 source=src_file, dynamic_shapes=(dyn,) if dyn is not None else None,
                 notes=notes)
    names = list(SLOT_INPUTS[:len(examples)])
    flat, placeholders, weights = _flatten_inputs(ep, examples, names)
    namer, symbols = name_symbols(ep, dyn, examples)
    if dyn is not None:
        flat = [real_view(n.meta["val"]) for n in ep.graph_module.graph.nodes
                if n.op == "placeholder"]
    renamed, stored = [], {}
    for ph in placeholders:
        if ph["kind"] == "weight" and ph["name"] in states:
            renamed.append({"kind": "state", "name": ph["name"].removeprefix("g.")})
        elif ph["kind"] == "weight":
            new = ph["name"].removeprefix(strip)
            stored[new] = weights[ph["name"]]
            renamed.append({"kind": "weight", "name": new})
        else:
            renamed.append(ph)
    graph = graph_to_json(decompose(ep.graph_module, flat, symbolic=dyn is not None),
                          renamed, namer)
    user = [i for i in graph["inputs"] if i["kind"] == "input"]
    inputs = [{"name": name, "dtype": "int64", "shape": graph["values"][u["value"]]["shape"],
               "values": (list(values) if values else [0, int(examples[0].max())])
               if name == "input_ids" else [0, 0]} for name, u in zip(names, user)]
    out_meta = graph["values"][graph["outputs"][0]["slot"]]
    return ({"graph": graph, "inputs": inputs, "symbols": symbols, "output_meta": out_meta,
             "output_tree": {"kind": "tensor", "index": 0}}, stored)
