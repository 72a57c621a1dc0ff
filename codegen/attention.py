"""Graph rewrites of scaled-dot-product attention calls (an extern): masks that export can
prove are no-ops or causal are replaced by what eager code passes, so SDPA keeps its fused
kernels. `g` is the GraphLowering whose values, realized bodies and facts are consulted.
"""
from __future__ import annotations

import sympy
import torch

from aotc.codegen.constfold import UNKNOWN, constant_value, is_causal_mask


def simplify_attention_mask(g, node: dict) -> dict:
    """SDPA's attention mask, when export can prove what it is, replaced by what eager
    execution would have passed: nothing for a mask that masks nothing (all True; all 0
    when additive), `is_causal=True` for the causal mask `j <= i`. Traced transformers
    materialize such masks (`arange(n) >= 0`, `kv_idx <= q_idx`, expanded) where eager
    code skips them, and a mask keeps SDPA from its flash kernels: on an H200 at batch 32
    the masked call of ViT-B/16 ran at half eager's speed."""
    from aotc.codegen.graph import TensorValue   # graph.py calls this module
    args, kwargs = list(node["args"]), dict(node["kwargs"])
    get = lambda i, name, default: (args[i] if len(args) > i   # noqa: E731
                                    else kwargs.get(name, default))
    mask = get(3, "attn_mask", None)
    if not (isinstance(mask, dict) and "slot" in mask):
        return node
    sid = mask["slot"]
    tv = g.env[sid]
    if sid not in g.mask_facts:
        value = constant_value(tv, g.bodies) if isinstance(tv, TensorValue) else UNKNOWN
        no_op = value is True if tv.dtype == torch.bool else (
            tv.dtype.is_floating_point and value is not UNKNOWN and value == 0)
        g.mask_facts[sid] = "none" if no_op else "causal" if (
            isinstance(tv, TensorValue) and is_causal_mask(tv, g.bodies)) else None
    fact = g.mask_facts[sid]
    causal = fact == "causal" and get(4, "dropout_p", 0.0) == 0.0 \
        and get(5, "is_causal", False) is False and _same_length(g, args, tv)
    if fact != "none" and not causal:
        return node

    def put(i: int, name: str, value) -> None:
        if len(args) > i:
            args[i] = value
        else:
            kwargs[name] = value
    put(3, "attn_mask", None)
    if causal:
        put(5, "is_causal", True)
    return dict(node, args=args, kwargs=kwargs)

def _same_length(g, args: list, mask) -> bool:
    """Query length == key length == the mask's last two dims (SDPA's is_causal aligns the
    mask's top left corner; only a square mask is `j <= i` both ways)."""
    from aotc.codegen.graph import TensorValue
    q, k = (g.env[a["slot"]] if isinstance(a, dict) else None for a in args[:2])
    if not (isinstance(q, TensorValue) and isinstance(k, TensorValue)):
        return False
    sizes = {sympy.sympify(x) for x in (q.shape[-2], k.shape[-2], *mask.shape[-2:])}
    return len(sizes) == 1


def output_dim_order(g, node: dict) -> tuple[int, ...] | None:
    """The memory order (outermost first) of the output this machine's SDPA returns for the
    call `node`, found by running it on tiny inputs of the same kinds (dtype, mask dtype,
    causal, scale, GQA). CPU flash attention writes (batch, seq, heads, dim) and returns it
    transposed to (batch, heads, seq, dim); a plan that assumed a contiguous output copied it
    (`layout`) and then copied it again into the (batch, seq, heads*dim) a projection reads.
    None where the call is not 4-d or the probe fails; a runtime whose SDPA answers in another
    layout still gets a copy, never a wrong read (runtime/executor.py `layout`)."""
    from aotc.codegen.graph import TensorValue
    args, kwargs = list(node["args"]), dict(node["kwargs"])
    get = lambda i, name, default: (args[i] if len(args) > i   # noqa: E731
                                    else kwargs.get(name, default))
    q, k, v = (g.env[a["slot"]] if isinstance(a, dict) and "slot" in a else None
               for a in args[:3])
    if not all(isinstance(t, TensorValue) and len(t.shape) == 4 for t in (q, k, v)):
        return None
    mask = get(3, "attn_mask", None)
    mask_tv = g.env[mask["slot"]] if isinstance(mask, dict) and "slot" in mask else None
    if mask is not None and not isinstance(mask_tv, TensorValue):
        return None
    gqa = bool(get(7, "enable_gqa", False))

    def like(a, heads):
        """Zeros of (1, heads, 4, 8) laid out in the memory order of the argument's value
        (the kernels choose by layout: flash answers in its query's order)."""
        meta = g.values[a["slot"]] or {}
        stride = [_at_some_size(x) for x in meta.get("stride", ())]
        order = sorted(range(4), key=lambda d: (-stride[d], d)) if len(stride) == 4 else \
            list(range(4))
        sizes = (1, heads, 4, 8)
        t = torch.zeros([sizes[d] for d in order], dtype=g.env[a["slot"]].dtype)
        return t.permute([order.index(d) for d in range(4)])
    try:
        tq, tk, tv_ = like(args[0], 2), like(args[1], 1 if gqa else 2), \
            like(args[2], 1 if gqa else 2)
        tm = None if mask_tv is None else torch.zeros((1,) * (len(mask_tv.shape) - 2) + (4, 4),
                                                      dtype=mask_tv.dtype)
        if tm is not None and tm.dtype == torch.bool:
            tm = ~tm
        out = torch.ops.aten.scaled_dot_product_attention.default(
            tq, tk, tv_, tm, float(get(4, "dropout_p", 0.0)), bool(get(5, "is_causal", False)),
            scale=get(6, "scale", None), enable_gqa=gqa)
    except Exception:   # noqa: BLE001 - a probe: any failure keeps the contiguous layout
        return None
    order = sorted(range(4), key=lambda d: (-out.stride(d), d))
    return tuple(order)


def _at_some_size(n) -> int:
    """A stride's value with every size symbol at 64 (orders strides by size)."""
    from aotc.codegen.ir import sym
    e = sym(n)
    return int(e.subs({x: 64 for x in e.free_symbols}))


# ------------------------------------------------------------------ hand-written attention
_VIEWS = ("aten::view.default", "aten::reshape.default")
# Keys below which the fusion is left out: with 64 keys SDPA ran 0.95-1.0x the speed of aotc's
# two matmuls around one fused softmax kernel on the CPU; from 256 on 1.2-2.2x faster (one
# thread). A dynamic key length is fused (long sequences are where it matters).
MIN_KEYS = 128
_SDPA = "aten::scaled_dot_product_attention.default"


def fuse_manual_attention(graph: dict) -> tuple[dict, int]:
    """Hand-written attention, `softmax(q @ k^T [* c | / c] [+ mask]) @ v` over 4-d (batch,
    heads, seq, dim) tensors, becomes one SDPA call (as Inductor's attention patterns do), so
    it runs in the device's fused attention kernel instead of two batched matmuls around a
    softmax. Matched on the decomposed graph: each matmul is `bmm` between (batch*heads)-merged
    views of 4-d operands (through same-shape `expand` and `clone`), k^T a transpose of the
    last two dims of k, and the scores, scaled, masked and softmaxed values each used once
    (attention probabilities that are also returned or reused are left alone), with at least
    MIN_KEYS keys (or a dynamic key length). An additive
    floating mask becomes SDPA's `attn_mask`, and `masked_fill(m, -inf)` of a boolean m (which
    decomposes to `where(m, -inf, scores)`) becomes `attn_mask=logical_not(m)`.
    Returns (graph, number of attention calls fused); the graph given is not changed."""
    nodes = list(graph["nodes"])
    values = list(graph["values"])
    producer = {o: i for i, n in enumerate(nodes) for o in n["out"]}
    users: dict[int, int] = {}
    for n in nodes:
        for s in _slots(n["args"]) + _slots(list(n["kwargs"].values())):
            users[s] = users.get(s, 0) + 1
    for o in graph["outputs"]:
        if "slot" in o:
            users[o["slot"]] = users.get(o["slot"], 0) + 2   # never "used once"
    replaced: dict[int, list] = {}
    for i, n in enumerate(nodes):
        match = _match(n, nodes, values, producer, users)
        if match is not None:
            replaced[i] = match
    if not replaced:
        return graph, 0
    nodes = [m for i, n in enumerate(nodes) for m in replaced.get(i, [n])]
    return dict(graph, values=values, nodes=_drop_dead(nodes, graph["outputs"])), len(replaced)


def _slots(args) -> list[int]:
    out = []
    for a in args:
        if isinstance(a, list):
            out += _slots(a)
        elif isinstance(a, dict) and "slot" in a:
            out.append(a["slot"])
    return out


def _shape(values, vid):
    from aotc.codegen.ir import sym
    meta = values[vid] or {}
    return [sympy.expand(sym(d)) for d in meta.get("shape", ())] if "shape" in meta else None


def _match(final: dict, nodes, values, producer, users) -> list | None:
    """The nodes replacing `final` (the view of the second bmm back to 4-d): the SDPA call,
    after the `logical_not` of a boolean mask (its value appended to `values`); or None."""
    def node_of(vid):
        i = producer.get(vid)
        return nodes[i] if i is not None else None

    def single(vid):
        return users.get(vid, 0) == 1

    def arg(n, k):
        a = n["args"][k] if len(n["args"]) > k else None
        return a["slot"] if isinstance(a, dict) and "slot" in a else None

    if final["op"] not in _VIEWS or not final["single"] or final["kwargs"]:
        return None
    out = final["out"][0]
    bmm2 = node_of(arg(final, 0))
    shape4 = _shape(values, out)
    if bmm2 is None or bmm2["op"] != "aten::bmm.default" or shape4 is None or \
            len(shape4) != 4 or not single(bmm2["out"][0]):
        return None
    p4, v4 = (_merged_base(arg(bmm2, k), nodes, values, producer, users) for k in (0, 1))
    if p4 is None or v4 is None:
        return None
    softmax = node_of(p4)
    if softmax is None or softmax["op"] != "aten::_softmax.default" or not single(p4) or \
            softmax["args"][1] not in (-1, 3) or softmax["args"][2] is not False:
        return None
    x = arg(softmax, 0)
    mask, scale = None, 1.0
    step = node_of(x)
    if step is not None and step["op"] == "aten::add.Tensor" and single(x) and \
            not step["kwargs"] and len(step["args"]) == 2:
        a, b = arg(step, 0), arg(step, 1)
        scores_side = a if _from_bmm(a, nodes, producer) else b
        mask = b if scores_side == a else a
        if mask is None or scores_side is None or not _float_mask(values, mask, x):
            return None
        x = scores_side
        step = node_of(x)
    elif step is not None and step["op"] == "aten::where.self" and single(x) and \
            not step["kwargs"] and len(step["args"]) == 3:
        cond, fill = arg(step, 0), node_of(arg(step, 1))
        if cond is None or (values[cond] or {}).get("dtype") != "bool" or \
                len((values[cond] or {}).get("shape", (0,) * 5)) > 4 or fill is None or \
                fill["op"] != "aten::scalar_tensor.default" or \
                fill["args"][:1] != [{"float": "-inf"}] or arg(step, 2) is None:
            return None
        mask = ("not", cond)
        x = arg(step, 2)
        step = node_of(x)
    if step is not None and step["op"] in ("aten::div.Tensor", "aten::mul.Tensor") and \
            single(x) and not step["kwargs"] and isinstance(step["args"][1], (int, float)) and \
            not isinstance(step["args"][1], bool) and arg(step, 0) is not None:
        c = float(step["args"][1])
        if c == 0.0:
            return None
        scale = 1.0 / c if step["op"] == "aten::div.Tensor" else c
        x = arg(step, 0)
        step = node_of(x)
    # x: the scores as 4-d, a view of the first bmm
    if step is None or step["op"] not in _VIEWS or not single(x):
        return None
    bmm1 = node_of(arg(step, 0))
    if bmm1 is None or bmm1["op"] != "aten::bmm.default" or not single(bmm1["out"][0]):
        return None
    q4, kt4 = (_merged_base(arg(bmm1, k), nodes, values, producer, users) for k in (0, 1))
    k4 = _untransposed(kt4, nodes, producer, values)
    if q4 is None or k4 is None:
        return None
    sq, sk, sv = (_shape(values, t) for t in (q4, k4, v4))
    sp = _shape(values, p4)
    if any(s is None or len(s) != 4 for s in (sq, sk, sv, sp)) or sq[:2] != sk[:2] or \
            sk[:3] != sv[:3] or sq[3] != sk[3] or sp != [*sq[:3], sk[2]] or \
            shape4 != [*sq[:3], sv[3]]:
        return None
    if sk[2].is_Integer and int(sk[2]) < MIN_KEYS:   # short rows: no gain (see MIN_KEYS)
        return None
    dtypes = {(values[t] or {}).get("dtype") for t in (q4, k4, v4, out)}
    if len(dtypes) != 1 or dtypes.pop() not in ("float32", "float16", "bfloat16", "float64"):
        return None
    before = []
    if isinstance(mask, tuple):   # where(m, -inf, s): SDPA keeps where its boolean mask is True
        meta = values[mask[1]]
        values.append(dict(meta, stride=_contiguous_strides(meta["shape"])))
        before.append({"op": "aten::logical_not.default", "args": [{"slot": mask[1]}],
                       "kwargs": {}, "out": [len(values) - 1], "single": True})
        mask = len(values) - 1
    return before + [{"op": _SDPA, "args": [{"slot": q4}, {"slot": k4}, {"slot": v4},
                                            None if mask is None else {"slot": mask}, 0.0,
                                            False],
                      "kwargs": {"scale": scale}, "out": [out], "single": True}]


def _contiguous_strides(shape: list) -> list:
    from aotc.codegen.ir import contiguous_strides, size_texts, sym
    return size_texts(contiguous_strides([sym(d) for d in shape]))


def _merged_base(vid, nodes, values, producer, users):
    """The 4-d tensor whose first two dims a bmm operand merges (through a view/reshape, and
    same-shape expand and contiguous clone between), or None."""
    if vid is None:
        return None
    i = producer.get(vid)
    n = nodes[i] if i is not None else None
    if n is None or n["op"] not in _VIEWS or users.get(vid, 0) != 1:
        return None
    base = n["args"][0]["slot"] if isinstance(n["args"][0], dict) else None
    while base is not None:
        j = producer.get(base)
        m = nodes[j] if j is not None else None
        src = m["args"][0]["slot"] if m is not None and m["args"] and \
            isinstance(m["args"][0], dict) and "slot" in m["args"][0] else None
        if m is not None and m["op"] == "aten::clone.default" and src is not None and \
                m["kwargs"].get("memory_format") in (None, {"memory_format": "contiguous_format"}):
            base = src
        elif m is not None and m["op"] == "aten::expand.default" and src is not None and \
                _shape(values, src) == _shape(values, base):
            base = src
        else:
            break
    s4, s3 = _shape(values, base) if base is not None else None, _shape(values, vid)
    if s4 is None or s3 is None or len(s4) != 4 or len(s3) != 3 or \
            sympy.expand(s4[0] * s4[1]) != s3[0] or s4[2:] != s3[1:]:
        return None
    return base


def _untransposed(kt, nodes, producer, values):
    """k for k^T = permute(k, [0, 1, 3, 2]) / transpose(k, -2, -1), or None."""
    if kt is None:
        return None
    i = producer.get(kt)
    n = nodes[i] if i is not None else None
    if n is None or not (n["args"] and isinstance(n["args"][0], dict) and "slot" in n["args"][0]):
        return None
    if n["op"] == "aten::permute.default" and list(n["args"][1]) in ([0, 1, 3, 2],
                                                                      [0, 1, -1, -2]):
        return n["args"][0]["slot"]
    if n["op"] == "aten::transpose.int" and sorted(d % 4 for d in n["args"][1:3]) == [2, 3]:
        return n["args"][0]["slot"]
    return None


def _from_bmm(vid, nodes, producer) -> bool:
    """Whether `vid` is the scores: a view, or a scaled view, of a bmm."""
    for _ in range(2):
        i = producer.get(vid)
        if i is None:
            return False
        n = nodes[i]
        if n["op"] == "aten::bmm.default":
            return True
        if not n["args"] or not isinstance(n["args"][0], dict) or "slot" not in n["args"][0]:
            return False
        vid = n["args"][0]["slot"]
    i = producer.get(vid)
    return i is not None and nodes[i]["op"] == "aten::bmm.default"


def _float_mask(values, mask, scores) -> bool:
    """An additive mask SDPA takes as it is: floating, of the scores' dtype, at most 4-d."""
    m, s = values[mask] or {}, values[scores] or {}
    return m.get("dtype") == s.get("dtype") and len(m.get("shape", ())) <= 4 and \
        "shape" in m


_PURE = frozenset({*_VIEWS, "aten::bmm.default", "aten::clone.default", "aten::expand.default",
                   "aten::permute.default", "aten::transpose.int", "aten::div.Tensor",
                   "aten::mul.Tensor", "aten::add.Tensor", "aten::_softmax.default",
                   "aten::where.self", "aten::scalar_tensor.default"})


def _drop_dead(nodes: list, outputs: list) -> list:
    """Nodes of the kinds a fused attention leaves behind (its matmuls, views, scaling and
    softmax) whose results nothing reads any more."""
    live = {o["slot"] for o in outputs if "slot" in o}
    kept = []
    for n in reversed(nodes):
        if n["op"] in _PURE and not (set(n["out"]) & live):
            continue
        live |= set(_slots(n["args"]) + _slots(list(n["kwargs"].values())))
        kept.append(n)
    return kept[::-1]
