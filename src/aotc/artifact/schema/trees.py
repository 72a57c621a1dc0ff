"""Output tree specs, checked: how a model's flat outputs are put back into its structure.

  {"kind": "tensor", "index": i}                        the i-th flat output
  {"kind": "tuple" | "list", "items": [...]}
  {"kind": "dict", "keys": [...], "items": [...], "class": "BaseModelOutput" | null}
  {"kind": "const", "value": v}                         None, bool, int, float or str
"""
from __future__ import annotations

from aotc.artifact.schema.fields import MAX_DEPTH, At

KINDS = ("tensor", "tuple", "list", "dict", "const")


def parse_tree(a: At, n_outputs: int, depth: int = 0) -> dict:
    """The tree as plain JSON, every node checked (indices below `n_outputs`, depth bounded)."""
    a.check(depth <= MAX_DEPTH, f"an output structure nested at most {MAX_DEPTH} levels",
            "is nested too deeply")
    kind = a.get("kind").str(choices=KINDS)
    if kind == "tensor":
        a.obj(required=("kind", "index"))
        return {"kind": kind, "index": a.get("index").int(0, max(n_outputs - 1, 0))} \
            if n_outputs else a.fail("no tensor leaf: the entry has no outputs")
    if kind == "const":
        a.obj(required=("kind", "value"))
        v = a.get("value")
        v.check(v.value is None or isinstance(v.value, (bool, int, float, str)),
                "a constant: null, a boolean, a number or a string")
        return {"kind": kind, "value": v.text(1024) if isinstance(v.value, str) else v.value}
    items = [parse_tree(i, n_outputs, depth + 1) for i in a.get("items").list(1 << 16)]
    if kind in ("tuple", "list"):
        a.obj(required=("kind", "items"))
        return {"kind": kind, "items": items}
    a.obj(required=("kind", "keys", "items"), optional=("class",))
    keys = a.get("keys").list(1 << 16)
    a.check(len(keys) == len(items), "one key per item", "has unequal keys and items")
    cls = a.get("class", None)
    out = {"kind": kind, "keys": [_key(k) for k in keys], "items": items}
    if a.has("class"):
        out["class"] = None if cls.is_null() else cls.text(128)
    return out


def _key(k: At):
    if isinstance(k.value, int) and not isinstance(k.value, bool):
        return k.int(-(1 << 62), 1 << 62)
    return k.str(max_len=256)
