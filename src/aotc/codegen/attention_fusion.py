"""Hand-written attention fused into one SDPA call: a rewrite of the decomposed ATen graph
(the `graph` dict of a Program), run before lowering in CPU inference.

    softmax(q @ k^T [* c | / c] [+ mask | masked_fill(m, -inf)]) @ v    over (batch, heads,
                                                                          seq, dim) tensors
      -> scaled_dot_product_attention(q, k, v, attn_mask, scale=...)

as Inductor's attention patterns do, so the product runs in the device's fused attention kernel
instead of two batched matmuls around a softmax. Each matmul is `bmm` between (batch*heads)-merged
views of 4-d operands (through same-shape `expand` and contiguous `clone`), k^T a transpose of
the last two dims of k, and the scores, scaled, masked and softmaxed values are each used once
(attention probabilities also returned or reused are left alone). An additive floating mask
becomes `attn_mask`; `masked_fill(m, -inf)` of a boolean m (decomposed to `where(m, -inf, s)`)
becomes `attn_mask=logical_not(m)`.
"""
from __future__ import annotations

import sympy

from aotc.codegen.ir import contiguous_strides, size_texts, sym
from aotc.artifact.encoding import slots_in

_VIEWS = ("aten::view.default", "aten::reshape.default")
_BMM = "aten::bmm.default"
_SDPA = "aten::scaled_dot_product_attention.default"
# Keys below which the fusion is left out: with 64 keys SDPA ran 0.95-1.0x the speed of aotc's
# two matmuls around one fused softmax kernel on the CPU; from 256 on 1.2-2.2x faster (one
# thread). A dynamic key length is fused (long sequences are where it matters).
MIN_KEYS = 128
REWRITE = "hand-written attention -> scaled_dot_product_attention"
# what a fused attention leaves behind, dropped once nothing reads it
_PURE = frozenset({*_VIEWS, _BMM, "aten::clone.default", "aten::expand.default",
                   "aten::permute.default", "aten::transpose.int", "aten::div.Tensor",
                   "aten::mul.Tensor", "aten::add.Tensor", "aten::_softmax.default",
                   "aten::where.self", "aten::scalar_tensor.default"})


def fuse_manual_attention(graph: dict) -> tuple[dict, int]:
    """(graph with each matched attention replaced by SDPA, number fused), for at least
    MIN_KEYS keys (or a dynamic key length); the graph given is not changed."""
    g = _Graph(graph)
    replaced = {i: m for i, n in enumerate(g.nodes) if (m := _match(g, n)) is not None}
    if not replaced:
        return graph, 0
    nodes = [m for i, n in enumerate(g.nodes) for m in replaced.get(i, [n])]
    return dict(graph, values=g.values, nodes=_drop_dead(nodes, graph["outputs"])), len(replaced)


class _Graph:
    """The graph as the matcher reads it: producers, use counts, shapes; `values` is a copy
    the rewrite may append to."""

    def __init__(self, graph: dict):
        self.nodes, self.values = list(graph["nodes"]), list(graph["values"])
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n["out"]}
        self.users: dict[int, int] = {}
        for n in self.nodes:
            for s in _reads(n):
                self.users[s] = self.users.get(s, 0) + 1
        for o in graph["outputs"]:
            if "slot" in o:
                self.users[o["slot"]] = self.users.get(o["slot"], 0) + 2   # never "used once"

    def node(self, vid):
        i = self.producer.get(vid)
        return self.nodes[i] if i is not None else None

    def single(self, vid) -> bool:
        return self.users.get(vid, 0) == 1

    def meta(self, vid) -> dict:
        return self.values[vid] or {}

    def shape(self, vid):
        meta = self.meta(vid)
        return [sympy.expand(sym(d)) for d in meta["shape"]] if "shape" in meta else None


def _arg(n: dict, k: int):
    """The slot of node `n`'s argument k, or None."""
    a = n["args"][k] if len(n["args"]) > k else None
    return a["slot"] if isinstance(a, dict) and "slot" in a else None


def _reads(n: dict) -> list[int]:
    return slots_in(n["args"]) + slots_in(list(n["kwargs"].values()))


def _match(g: _Graph, final: dict) -> list | None:
    """The nodes replacing `final` (the view of the second bmm back to 4-d): the SDPA call,
    after the `logical_not` of a boolean mask (its value appended to `g.values`); or None."""
    if final["op"] not in _VIEWS or not final["single"] or final["kwargs"]:
        return None
    out = final["out"][0]
    bmm2, shape4 = g.node(_arg(final, 0)), g.shape(out)
    if bmm2 is None or bmm2["op"] != _BMM or shape4 is None or len(shape4) != 4 or \
            not g.single(bmm2["out"][0]):
        return None
    p4, v4 = (_merged_base(g, _arg(bmm2, k)) for k in (0, 1))
    softmax = g.node(p4)
    if p4 is None or v4 is None or softmax is None or \
            softmax["op"] != "aten::_softmax.default" or not g.single(p4) or \
            softmax["args"][1] not in (-1, 3) or softmax["args"][2] is not False:
        return None
    scores = _scores(g, _arg(softmax, 0))
    if scores is None:
        return None
    bmm1, mask, scale = scores
    q4, kt4 = (_merged_base(g, _arg(bmm1, k)) for k in (0, 1))
    k4 = _untransposed(g, kt4)
    if q4 is None or k4 is None or not _shapes_agree(g, q4, k4, v4, p4, out):
        return None
    before = []
    if isinstance(mask, tuple):   # where(m, -inf, s): SDPA keeps where its boolean mask is True
        cond = mask[1]
        meta = g.meta(cond)
        g.values.append(dict(meta, stride=size_texts(contiguous_strides(
            [sym(d) for d in meta["shape"]]))))
        mask = len(g.values) - 1
        before.append({"op": "aten::logical_not.default", "args": [{"slot": cond}],
                       "kwargs": {}, "out": [mask], "single": True})
    return before + [{"op": _SDPA, "args": [{"slot": q4}, {"slot": k4}, {"slot": v4},
                                            None if mask is None else {"slot": mask}, 0.0,
                                            False],
                      "kwargs": {"scale": scale}, "out": [out], "single": True}]


def _scores(g: _Graph, x):
    """From the softmax's input back to the first bmm: (bmm node, mask, scale), where mask is
    None, an additive mask's slot or ("not", boolean slot); None if the chain differs."""
    mask, scale = None, 1.0
    step = g.node(x)
    if step is not None and step["op"] == "aten::add.Tensor" and g.single(x) and \
            not step["kwargs"] and len(step["args"]) == 2:
        a, b = _arg(step, 0), _arg(step, 1)
        scores = a if _from_bmm(g, a) else b
        mask = b if scores == a else a
        if mask is None or scores is None or not _float_mask(g, mask, x):
            return None
        x, step = scores, g.node(scores)
    elif step is not None and step["op"] == "aten::where.self" and g.single(x) and \
            not step["kwargs"] and len(step["args"]) == 3:
        cond, fill = _arg(step, 0), g.node(_arg(step, 1))
        if cond is None or g.meta(cond).get("dtype") != "bool" or \
                len(g.meta(cond).get("shape", (0,) * 5)) > 4 or fill is None or \
                fill["op"] != "aten::scalar_tensor.default" or \
                fill["args"][:1] != [{"float": "-inf"}] or _arg(step, 2) is None:
            return None
        mask = ("not", cond)
        x = _arg(step, 2)
        step = g.node(x)
    if step is not None and step["op"] in ("aten::div.Tensor", "aten::mul.Tensor") and \
            g.single(x) and not step["kwargs"] and isinstance(step["args"][1], (int, float)) \
            and not isinstance(step["args"][1], bool) and _arg(step, 0) is not None:
        c = float(step["args"][1])
        if c == 0.0:
            return None
        scale = 1.0 / c if step["op"] == "aten::div.Tensor" else c
        x = _arg(step, 0)
        step = g.node(x)
    # x: the scores as 4-d, a view of the first bmm
    if step is None or step["op"] not in _VIEWS or not g.single(x):
        return None
    bmm1 = g.node(_arg(step, 0))
    if bmm1 is None or bmm1["op"] != _BMM or not g.single(bmm1["out"][0]):
        return None
    return bmm1, mask, scale


def _shapes_agree(g: _Graph, q4, k4, v4, p4, out) -> bool:
    """q [b, h, L, E], k [b, h, S, E], v [b, h, S, Ev], probabilities [b, h, L, S], the
    output [b, h, L, Ev]; one floating dtype; at least MIN_KEYS keys unless S is dynamic."""
    sq, sk, sv, sp, so = (g.shape(t) for t in (q4, k4, v4, p4, out))
    if any(s is None or len(s) != 4 for s in (sq, sk, sv, sp, so)) or sq[:2] != sk[:2] or \
            sk[:3] != sv[:3] or sq[3] != sk[3] or sp != [*sq[:3], sk[2]] or \
            so != [*sq[:3], sv[3]]:
        return False
    if sk[2].is_Integer and int(sk[2]) < MIN_KEYS:   # short rows: no gain (see MIN_KEYS)
        return False
    dtypes = {g.meta(t).get("dtype") for t in (q4, k4, v4, out)}
    return len(dtypes) == 1 and dtypes.pop() in ("float32", "float16", "bfloat16", "float64")


def _merged_base(g: _Graph, vid):
    """The 4-d tensor whose first two dims a bmm operand merges (through a view/reshape, and
    same-shape expand and contiguous clone between), or None."""
    n = g.node(vid) if vid is not None else None
    if n is None or n["op"] not in _VIEWS or not g.single(vid):
        return None
    base = _arg(n, 0)
    while base is not None:
        m = g.node(base)
        src = _arg(m, 0) if m is not None and m["args"] else None
        if m is not None and m["op"] == "aten::clone.default" and src is not None and \
                m["kwargs"].get("memory_format") in (None, {"memory_format": "contiguous_format"}):
            base = src
        elif m is not None and m["op"] == "aten::expand.default" and src is not None and \
                g.shape(src) == g.shape(base):
            base = src
        else:
            break
    s4, s3 = g.shape(base) if base is not None else None, g.shape(vid)
    if s4 is None or s3 is None or len(s4) != 4 or len(s3) != 3 or \
            sympy.expand(s4[0] * s4[1]) != s3[0] or s4[2:] != s3[1:]:
        return None
    return base


def _untransposed(g: _Graph, kt):
    """k for k^T = permute(k, [0, 1, 3, 2]) / transpose(k, -2, -1), or None."""
    n = g.node(kt) if kt is not None else None
    if n is None or _arg(n, 0) is None:
        return None
    if n["op"] == "aten::permute.default" and list(n["args"][1]) in ([0, 1, 3, 2],
                                                                      [0, 1, -1, -2]):
        return _arg(n, 0)
    if n["op"] == "aten::transpose.int" and sorted(d % 4 for d in n["args"][1:3]) == [2, 3]:
        return _arg(n, 0)
    return None


def _from_bmm(g: _Graph, vid) -> bool:
    """Whether `vid` is the scores: a view, or a scaled view, of a bmm."""
    for _ in range(2):
        n = g.node(vid)
        if n is None:
            return False
        if n["op"] == _BMM:
            return True
        vid = _arg(n, 0) if n["args"] else None
        if vid is None:
            return False
    n = g.node(vid)
    return n is not None and n["op"] == _BMM


def _float_mask(g: _Graph, mask, scores) -> bool:
    """An additive mask SDPA takes as it is: floating, of the scores' dtype, at most 4-d."""
    m = g.meta(mask)
    return "shape" in m and m.get("dtype") == g.meta(scores).get("dtype") and \
        len(m["shape"]) <= 4


def _drop_dead(nodes: list, outputs: list) -> list:
    """Nodes of the kinds a fused attention leaves behind whose results nothing reads."""
    live = {o["slot"] for o in outputs if "slot" in o}
    kept = []
    for n in reversed(nodes):
        if n["op"] in _PURE and not (set(n["out"]) & live):
            continue
        live |= set(_reads(n))
        kept.append(n)
    return kept[::-1]
