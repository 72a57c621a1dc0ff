"""State updates: a generator's cache writes made in place (the Program graph in, rewritten).

A captured generator entry is functional: a cache write is `new = index_put(cache, [.., pos],
kv)` (decode) or `new = slice_scatter(cache, kv, 2, 0, T)` (prefill), and the graph ends with
`copy_(cache, new)` into the state. Run as written, every step would copy the whole cache twice.
A prefill's new keys arrive as `copy(slice(cache), kv)`; that copy is dropped and `kv` itself
is copied into the slice.
`reinplace` rewrites such a write into the in-place op on the state itself (`index_put_`, or a
`slice` view and `copy_` into it), and drops the write-back, when nothing reads the old values
of the state apart from the write (its other uses only take its shape, as `copy(slice(cache),
kv)` does). Other write-backs (the position: `copy_(pos, pos + 1)`) stay, marked `writeback`:
codegen lowers them after the graph's outputs, so every read of the old value comes first.
"""
from __future__ import annotations

import copy

VIEWS = frozenset({"aten::slice.Tensor", "aten::view.default", "aten::reshape.default",
                   "aten::permute.default", "aten::expand.default", "aten::select.int",
                   "aten::unsqueeze.default", "aten::transpose.int", "aten::alias.default"})
IN_PLACE = {"aten::index_put.default": "aten::index_put_.default",
            "aten::index_copy.default": "aten::index_copy_.default"}


def _refs(a) -> list[int]:
    if isinstance(a, list):
        return [s for x in a for s in _refs(x)]
    return [a["slot"]] if isinstance(a, dict) and "slot" in a else []


def _users(nodes: list) -> dict[int, list[tuple[int, int]]]:
    """value -> [(node index, argument position)] of the nodes reading it."""
    users: dict[int, list] = {}
    for i, n in enumerate(nodes):
        for pos, a in enumerate([*n["args"], *n["kwargs"].values()]):
            for s in _refs(a):
                users.setdefault(s, []).append((i, pos))
    return users


def _shape_only(nodes, users, i: int, pos: int, seen=0) -> bool:
    """Whether node i's argument `pos` is used for its shape alone: the destination of a
    functional `copy`, or a view whose every use is such."""
    n = nodes[i]
    if n["op"] == "aten::copy.default" and pos == 0:
        return True
    if n["op"] in VIEWS and pos == 0 and seen < 8:
        return all(_shape_only(nodes, users, j, p, seen + 1)
                   for o in n["out"] for j, p in users.get(o, []))
    return False


def reinplace(graph: dict) -> dict:
    """The graph with its state write-backs made in place where that is safe (see above)."""
    graph = copy.deepcopy(graph)
    nodes, values = graph["nodes"], graph["values"]
    states = {i["value"] for i in graph["inputs"] if i["kind"] == "state"}
    producer = {o: k for k, n in enumerate(nodes) for o in n["out"]}
    users = _users(nodes)
    replace: dict[int, list] = {}      # node index -> the nodes it becomes ([] drops it)
    renames: dict[int, int] = {}
    for w, node in enumerate(nodes):
        target = _refs(node["args"][0]) if node["op"] == "aten::copy_.default" else []
        if not target or target[0] not in states:
            continue
        s, (x,) = target[0], _refs(node["args"][1])
        p = producer.get(x)
        others = [(i, pos) for i, pos in users.get(s, []) if i not in (w, p)]
        safe = p is not None and _refs(nodes[p]["args"][0])[:1] == [s] and all(
            _shape_only(nodes, users, i, pos) for i, pos in others)
        new = _in_place(nodes[p], values, s) if safe else None
        if new is None:
            node["writeback"] = True
            continue
        replace[p], replace[w] = new, []
        if new[0]["op"] == "aten::slice.Tensor":   # its result is the written state itself
            renames[x] = s
            direct = _copied_from(nodes, producer, users, new[1]["args"][1])
            if direct is not None:
                replace[direct[0]], new[1]["args"][1] = [], direct[1]
    out = [m for k, n in enumerate(nodes) for m in replace.get(k, [n])]
    graph["nodes"] = [_renamed(n, renames) for n in out]
    graph["outputs"] = [_renamed_arg(o, renames) for o in graph["outputs"]]
    return graph


def _in_place(n: dict, values: list, s: int) -> list | None:
    """The nodes that do `n`'s write into state `s` in place, or None."""
    if n["op"] in IN_PLACE:
        accumulate = n["args"][3] if len(n["args"]) > 3 else n["kwargs"].get("accumulate", False)
        if n["op"] == "aten::index_put.default" and accumulate:
            return None
        return [dict(n, op=IN_PLACE[n["op"]])]
    if n["op"] != "aten::slice_scatter.default":
        return None
    args = n["args"] + [None] * (6 - len(n["args"]))
    _, src, dim, start, end, step = args[:6]
    src_meta, state_meta = values[_refs(src)[0]], values[s]
    values.append({"shape": src_meta["shape"], "dtype": state_meta["dtype"],
                   "stride": state_meta["stride"]})
    view = len(values) - 1
    values.append(dict(values[view]))
    return [{"op": "aten::slice.Tensor", "kwargs": {}, "out": [view], "single": True,
             "args": [{"slot": s}, dim if dim is not None else 0, start, end,
                      step if step is not None else 1]},
            {"op": "aten::copy_.default", "args": [{"slot": view}, src], "kwargs": {},
             "out": [view + 1], "single": True}]


def _copied_from(nodes, producer, users, src) -> tuple[int, object] | None:
    """(the node, its source) where the value written is `copy(dest, y)` read by the write
    alone: `y` is written directly (copy_ converts and broadcasts as copy does), and the
    functional copy, a whole extra pass over the new keys or values, goes."""
    refs = _refs(src)
    k = producer.get(refs[0]) if len(refs) == 1 else None
    if k is None or nodes[k]["op"] != "aten::copy.default" or len(users.get(refs[0], [])) != 1:
        return None
    return k, nodes[k]["args"][1]


def _renamed_arg(a, renames: dict):
    if isinstance(a, list):
        return [_renamed_arg(x, renames) for x in a]
    if isinstance(a, dict) and a.get("slot") in renames:
        return {"slot": renames[a["slot"]]}
    return a


def _renamed(n: dict, renames: dict) -> dict:
    if not renames:
        return n
    return dict(n, args=_renamed_arg(n["args"], renames),
                kwargs={k: _renamed_arg(v, renames) for k, v in n["kwargs"].items()})


DECODE = "aotc::decode_attention.default"
DECODE_WRITE = "aotc::decode_attention_write.default"


def fuse_cache_writes(graph: dict) -> dict:
    """A decode step's in-place cache writes (`index_put_(cache, [.., .., pos], kv)`) folded
    into the attention that reads them (`aotc::decode_attention_write`): one kernel writes the
    new key and value and attends, instead of two index launches and the attention. Only where
    the written caches are read by that attention alone and index the same position."""
    graph = copy.deepcopy(graph)
    nodes = graph["nodes"]
    producer = {o: k for k, n in enumerate(nodes) for o in n["out"]}
    users = _users(nodes)
    drop: set[int] = set()
    for n in nodes:
        if n["op"] != DECODE:
            continue
        q, kx, vx, pos, scale, *extra = n["args"]     # extra: window, softcap, sinks
        writes = [_cache_write(nodes, producer, users, x, pos) for x in (kx, vx)]
        if None in writes:
            continue
        (ki, kc, knew), (vi, vc, vnew) = writes
        drop |= {ki, vi}
        n.update(op=DECODE_WRITE, args=[q, kc, vc, pos, knew, vnew, scale, *extra])
    graph["nodes"] = [n for k, n in enumerate(nodes) if k not in drop]
    return graph


def _cache_write(nodes, producer, users, x, pos):
    """(node index, cache, new value) if `x` is `index_put_(cache, [None, None, pos], v)` read
    only here, else None."""
    refs = _refs(x)
    k = producer.get(refs[0]) if refs else None
    if k is None or nodes[k]["op"] != "aten::index_put_.default":
        return None
    cache, index, value = nodes[k]["args"][:3]
    if index[:2] != [None, None] or len(index) != 3 or index[2] != pos \
            or len(users.get(refs[0], [])) != 1:
        return None
    return k, cache, value
