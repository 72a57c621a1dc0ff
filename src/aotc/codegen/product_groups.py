"""Products of one row that share their input, made one product (the Program graph in,
rewritten): `mm(x, W1)`, `mm(x, W2)`, ... of a [1, K] x become `y = mm(x, cat([W1, W2, ...],
1))` and slices of y; `addmm(b1, x, W1)`, ... with biases that are weights (Qwen2's q/k/v)
become `addmm(cat([b1, ...]), x, cat([W1, ...], 1))`.

A decode step at batch 1 reads each weight once, in products of one row (matrix-vector
products, codegen/lowering/matvec.py), and an attention layer's query, key and value
projections all read the same normed hidden state. Products of the same width already share a
kernel (the scheduler fuses reductions over the same rows); products of different widths (a
grouped-query layer's [1, 2048] queries against its [1, 512] keys and values) were two kernels
of a few microseconds each, each too small to reach the device's copy rate. Grouped, one
reduction streams all of their weights: the concatenation is never stored, its loads pick
the weight each output column belongs to (codegen/lowering/misc.py's cat, masked loads), so
the weights stay where they are, as they are (swaps and shards see no difference).

Applied to CUDA inference graphs, only to products of exactly one row with static sizes whose
right operands are weights (or a transposed view of one): products of more rows are vendor
GEMMs or the few-rows kernel, which would read a stored concatenation.
"""
from __future__ import annotations

import copy

MM = "aten::mm.default"
ADDMM = "aten::addmm.default"
THROUGH = frozenset({"aten::view.default", "aten::reshape.default", "aten::_unsafe_view.default",
                     "aten::alias.default"})
WEIGHT_VIEWS = frozenset({"aten::permute.default", "aten::t.default", "aten::transpose.int"})


def _slot(a):
    return a["slot"] if isinstance(a, dict) and "slot" in a else None


def _static(shape) -> bool:
    return isinstance(shape, list) and all(isinstance(d, int) for d in shape)


def _root(nodes, producer, v: int) -> int:
    """The value `v` is a reshaping of (through views that keep the data as it is)."""
    for _ in range(16):
        k = producer.get(v)
        if k is None or nodes[k]["op"] not in THROUGH or _slot(nodes[k]["args"][0]) is None:
            return v
        v = _slot(nodes[k]["args"][0])
    return v


def _weight_of(nodes, producer, weights: set, w: int):
    """None unless `w` is a weight or one view of a weight; else the view's node index, or -1
    for the weight itself."""
    if w in weights:
        return -1
    k = producer.get(w)
    if k is not None and nodes[k]["op"] in WEIGHT_VIEWS and \
            _slot(nodes[k]["args"][0]) in weights:
        return k
    return None


def _operands(n: dict, values: list, weights: set) -> tuple | None:
    """(x, w) of `mm(x, w)`, or of `addmm(bias, x, w)` whose bias is a weight of one dim (a
    Qwen2 layer's q/k/v biases); None for any other node."""
    args = n["args"]
    if n["kwargs"] or n["op"] not in (MM, ADDMM) or len(args) != (2 if n["op"] == MM else 3):
        return None
    if n["op"] == ADDMM:
        bias = _slot(args[0])
        if bias not in weights or not _static(values[bias]["shape"]) or \
                len(values[bias]["shape"]) != 1:
            return None
        args = args[1:]
    x, w = (_slot(a) for a in args)
    return None if x is None or w is None else (x, w)


def _groups(graph: dict) -> list[list[int]]:
    """Node indices of the one-row products to group, each group in graph order."""
    nodes, values = graph["nodes"], graph["values"]
    weights = {i["value"] for i in graph["inputs"] if i["kind"] == "weight"}
    producer = {o: k for k, n in enumerate(nodes) for o in n["out"]}
    found: dict = {}
    for k, n in enumerate(nodes):
        operands = _operands(n, values, weights)
        if operands is None:
            continue
        x, w = operands
        if _weight_of(nodes, producer, weights, w) is None:
            continue
        mx, mw = values[x], values[w]
        if not (_static(mx["shape"]) and _static(mw["shape"]) and len(mx["shape"]) == 2
                and mx["shape"][0] == 1 and mx["dtype"] == mw["dtype"]):
            continue
        found.setdefault((_root(nodes, producer, x), tuple(mx["shape"]), mx["dtype"], n["op"]),
                         []).append(k)
    widths = lambda g: {values[nodes[k]["out"][0]]["shape"][1] for k in g}  # noqa: E731
    return [g for g in found.values() if len(g) > 1 and len(widths(g)) > 1]


def group_products(graph: dict) -> dict:
    """`graph` with each group of one-row products over one input made one product (a copy;
    the graph itself is left as it is)."""
    groups = _groups(graph)
    if not groups:
        return graph
    graph = copy.deepcopy(graph)
    nodes, values = graph["nodes"], graph["values"]
    weights = {i["value"] for i in graph["inputs"] if i["kind"] == "weight"}
    producer = {o: k for k, n in enumerate(nodes) for o in n["out"]}
    before: dict[int, list] = {}     # node index -> nodes emitted in front of it
    instead: dict[int, dict] = {}    # node index -> the node replacing it
    for group in groups:
        first = nodes[group[0]]
        biased = first["op"] == ADDMM     # a group is all mm or all addmm (_groups)
        x = first["args"][1 if biased else 0]
        parts, widths = [], []
        for k in group:
            w = _slot(nodes[k]["args"][-1])
            view = _weight_of(nodes, producer, weights, w)
            if view >= 0:     # the weight's transposed view, again, ahead of the group
                values.append(dict(values[w]))
                before.setdefault(group[0], []).append(
                    dict(nodes[view], out=[len(values) - 1]))
                w = len(values) - 1
            parts.append({"slot": w})
            widths.append(values[w]["shape"][1])
        total, meta = sum(widths), values[_slot(x)]
        k_dim = values[_slot(parts[0])]["shape"][0]
        values.append(dict(meta, shape=[k_dim, total], stride=[total, 1]))
        cat = len(values) - 1
        values.append(dict(meta, shape=[1, total], stride=[total, 1]))
        product = len(values) - 1
        made = [{"op": "aten::cat.default", "args": [parts, 1], "kwargs": {}, "out": [cat],
                 "single": True}]
        operands = [x, {"slot": cat}]
        if biased:       # the biases, concatenated the same way
            values.append(dict(values[_slot(first["args"][0])], shape=[total], stride=[1]))
            made.append({"op": "aten::cat.default", "args": [[nodes[k]["args"][0] for k in group],
                                                                0],
                         "kwargs": {}, "out": [len(values) - 1], "single": True})
            operands = [{"slot": len(values) - 1}, *operands]
        made.append({"op": first["op"], "args": operands, "kwargs": {}, "out": [product],
                     "single": True})
        before.setdefault(group[0], []).extend(made)
        start = 0
        for k, width in zip(group, widths):
            out = nodes[k]["out"][0]
            values[out] = dict(values[out], stride=[total, 1])
            instead[k] = {"op": "aten::slice.Tensor", "kwargs": {}, "out": [out], "single": True,
                          "args": [{"slot": product}, 1, start, start + width, 1]}
            start += width
    graph["nodes"] = [m for k, n in enumerate(nodes)
                      for m in [*before.get(k, []), instead.get(k, n)]]
    return graph
