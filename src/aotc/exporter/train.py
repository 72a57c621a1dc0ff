"""Training capture: the joint forward/backward graph with AOTAutograd, partitioned.

    eager run in train mode (output structure, which buffers the forward updates)
      -> torch.export, strict (fullgraph: graph breaks are ExportErrors, as for inference)
      -> AOTAutograd over the captured module, with aotc's decompositions, partitioned by the
         min-cut rematerialization partitioner into
           forward(params, buffers, inputs)  -> (outputs, updated buffers, saved for backward)
           backward(saved, output grads)     -> (grads of params, buffers, inputs)
      -> a Program with both graphs

The function traced is purely functional: buffers the model updates in place (batch-norm
running statistics) are traced on copies and returned as extra outputs, which the runtime copies
back into its buffers; random ops (dropout) draw from torch's generator, so the caller's
`torch.manual_seed` makes a step reproducible.
"""
from __future__ import annotations

import torch
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.nn.attention import SDPBackend, sdpa_kernel

from aotc.errors import ExportError
from aotc.exporter.decomp import decomposition_table
from aotc.exporter.outputs import FlatOutputs, follow, tree_spec
from aotc.exporter.program import graph_to_json, node_source
from aotc.exporter.train_attention import keep_attention
from aotc.artifact.dtypes import dtype_name


def capture_training(model: torch.nn.Module, args: tuple, *, strict: bool, source, capture):
    """(forward graph, backward graph, output spec, metadata, eager outputs) of one training
    step of `model` on `args`."""
    model.train()
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    eager, mutated = _probe(model, args, buffers)
    spec, paths = tree_spec(eager)
    leaves = [follow(eager, p) for p in paths]
    needs_grad = [bool(t.requires_grad) for t in leaves]
    ep = capture(FlatOutputs(model, paths), args, strict=strict, source=source)
    gm = ep.module()
    pnames, bnames = list(params), list(buffers)
    # what the captured graph writes counts too: a kernel may update a buffer without a version
    # bump and to the value it had (bf16 running statistics at their fixed point)
    written = {n.removeprefix("m.") for n in _written_buffers(ep)}
    mutated = [n for n in bnames if n in written or n in mutated]

    def step(*flat):   # purely functional: updated buffers are outputs, inputs stay untouched
        p = dict(zip(pnames, flat[:len(pnames)]))
        b = {n: (v.clone() if n in mutated else v)
             for n, v in zip(bnames, flat[len(pnames):len(pnames) + len(bnames)])}
        outs = torch.func.functional_call(gm, {**_prefixed(p), **_prefixed(b)},
                                          tuple(flat[len(pnames) + len(bnames):]))
        return tuple(outs) + tuple(b[n] for n in mutated)

    gparams, gbufs = dict(gm.named_parameters()), dict(gm.named_buffers())
    inputs = [a.detach().requires_grad_(a.is_floating_point()) for a in args]  # input grads too
    flat = ([gparams.get(n, params[n]) for n in pnames]
            + [gbufs.get(n, buffers[n]).clone() for n in bnames] + inputs)
    # attention kept whole, its backward aotc's own op (exporter/train_attention.py); calls it
    # cannot take as the math ops they compute. Never the capturing machine's fused kernel: the
    # CPU's decomposes into one that returns the attention weights where the op returns its
    # logsumexp (gradients up to 16x off), and its backward op runs on no other device.
    keep_attention(gm)
    with sdpa_kernel([SDPBackend.MATH]):
        graphs = _trace(step, flat, needs_grad, len(leaves))
    if graphs["num_fwd_outputs"] != len(leaves) + len(mutated):
        raise ExportError("the forward updates state aotc did not detect",
                          where="AOTAutograd forward", expected=f"{len(leaves)} outputs and "
                          f"{len(mutated)} updated buffers",
                          found=f"{graphs['num_fwd_outputs']} forward outputs",
                          fix="report this as an aotc bug with the model")
    meta = {"params": pnames, "buffers": bnames, "mutated": mutated, "num_outputs": len(leaves),
            "needs_grad": needs_grad, "num_fwd_outputs": graphs["num_fwd_outputs"]}
    return graphs["forward"], graphs["backward"], spec, meta, leaves


def _probe(model, args, buffers: dict):
    """Run the model once in train mode: its outputs, and the buffers forward updates (whose
    values are then restored). The captured graph's signature completes the list."""
    versions = {n: b._version for n, b in buffers.items()}
    state = {n: b.detach().clone() for n, b in buffers.items()}
    eager = model(*args)
    mutated = [n for n, b in buffers.items()   # kernels may update without a version bump
               if b._version != versions[n] or not torch.equal(b, state[n])]
    with torch.no_grad():
        for n, b in buffers.items():
            b.copy_(state[n])
    return eager, mutated


def _written_buffers(ep) -> set[str]:
    """Buffers the exported graph writes: those its signature lists as mutated (functional IR)
    and those an op writes in place (training IR keeps `add_`, `batch_norm` on buffers): its
    schema marks them written, or, as `batch_norm`'s does not, they are the running statistics
    of a norm computed from the batch."""
    sig = ep.graph_signature
    written = set(sig.buffers_to_mutate.values())
    buffers = sig.inputs_to_buffers

    def root(node):   # the placeholder a view chain starts from
        while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
                and node.target.is_view and node.args:
            node = node.args[0]
        return node

    for node in ep.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        args = {a.name: (node.args[i] if i < len(node.args) else node.kwargs.get(a.name))
                for i, a in enumerate(target._schema.arguments)}
        batch_stats = any(args.get(k) is True for k in ("training", "use_input_stats"))
        for arg in target._schema.arguments:
            if not ((arg.alias_info is not None and arg.alias_info.is_write)
                    or (batch_stats and arg.name in ("running_mean", "running_var"))):
                continue
            value = args[arg.name]
            if isinstance(value, torch.fx.Node) and root(value).name in buffers:
                written.add(buffers[root(value).name])
    return written


def _trace(step, flat: list, needs_grad: list, n_outputs: int) -> dict:
    """Run `step` under AOTAutograd once, forward and backward, keeping the partitioned graphs."""
    graphs: dict = {}

    def partition(joint, inputs, **kw):
        graphs["num_fwd_outputs"] = kw["num_fwd_outputs"]
        return min_cut_rematerialization_partition(joint, inputs, **kw)

    def keep(name):
        def compiler(g, example):
            graphs[name] = g
            return _boxed(g)
        return compiler

    traced = aot_function(step, fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                          partition_fn=partition, decompositions=decomposition_table())
    outs = traced(*flat)
    diff = [o for o, g in zip(outs[:n_outputs], needs_grad) if g]
    if not diff:
        raise ExportError("no output of the model requires grad: nothing to train",
                          where="model outputs", expected="an output computed from parameters",
                          found="outputs without grad", fix="export for inference instead")
    torch.autograd.backward(diff, [torch.ones_like(o) for o in diff])
    if "backward" not in graphs:
        raise ExportError("AOTAutograd produced no backward graph", where="training capture",
                          expected="a forward and a backward graph", found="forward only",
                          fix="check that the outputs depend on parameters")
    return graphs


def _prefixed(d: dict) -> dict:
    return {f"m.{k}": v for k, v in d.items()}


def _boxed(g):
    def run(args):
        return g(*args)
    run._boxed_call = True
    return run


def training_graphs(fw, bw, meta: dict, args: tuple) -> tuple[dict, dict, list, list]:
    """Program graphs (JSON) of the partitioned forward and backward, with their input specs."""
    fw_ph = [n for n in fw.graph.nodes if n.op == "placeholder"]
    names = ([{"kind": "weight", "name": n} for n in meta["params"]]
             + [{"kind": "weight", "name": n} for n in meta["buffers"]]
             + [{"kind": "input", "name": f"input{i}"} for i in range(len(args))])
    if len(fw_ph) != len(names):
        raise ExportError("the training forward graph has an unexpected signature",
                          where="AOTAutograd forward", expected=f"{len(names)} inputs",
                          found=f"{len(fw_ph)} placeholders", fix="report this as an aotc bug")
    for gm, which in ((fw, "forward"), (bw, "backward")):
        _refuse_complex(gm, which)
    fgraph = graph_to_json(fw, names)
    bw_ph = [n for n in bw.graph.nodes if n.op == "placeholder"]
    bnames = [{"kind": "input", "name": n.name} for n in bw_ph]
    bgraph = graph_to_json(bw, bnames)
    binputs = [{"name": ph["name"], "dtype": bgraph["values"][ph["value"]]["dtype"],
                "shape": bgraph["values"][ph["value"]]["shape"], "values": None}
               for ph in bgraph["inputs"]]
    finputs = [{"name": f"input{i}", "dtype": dtype_name(a.dtype), "shape": list(a.shape),
                "values": None} for i, a in enumerate(args)]
    return fgraph, bgraph, finputs, binputs


def _refuse_complex(gm, which: str) -> None:
    """An ExportError for a complex value in a training step's graph: inference artifacts
    carry complex values as real pairs (exporter/complex.py), training ones not yet (a
    complex value saved for backward would cross the step's boundary)."""
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and v.is_complex():
            trace = n.meta.get("stack_trace")
            raise ExportError(f"the training step's {which} computes with complex numbers "
                              f"({n.target})",
                              where=node_source(trace) or f"{which} graph node {n.name}",
                              expected="real values in a training step (complex numbers and "
                                       "FFTs are computed as real pairs in inference exports)",
                              found=f"{n.target} -> {str(v.dtype).removeprefix('torch.')}",
                              fix="export for inference, or write this step with real "
                                  "tensors (rotary embeddings with cos and sin)")
