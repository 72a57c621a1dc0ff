"""Output tree specs: how a model's flat list of output tensors is put back into its structure.

A spec is plain JSON, written by the exporter and read by the runtime:
  {"kind": "tensor", "index": i}            the i-th flat output
  {"kind": "tuple" | "list", "items": [...]}
  {"kind": "dict", "keys": [...], "items": [...], "class": "BaseModelOutput"?}
  {"kind": "const", "value": v}             None, bool, int, float or str, returned as recorded
Dicts, dataclasses and HF `ModelOutput`s all come back as plain dicts (the recorded class name is
kept for `aotc inspect`).
"""
from __future__ import annotations

from enum import Enum


class Node(str, Enum):
    TENSOR = "tensor"
    TUPLE = "tuple"
    LIST = "list"
    DICT = "dict"
    CONST = "const"


def unflatten(spec: dict, flat):
    kind = spec["kind"]
    if kind == Node.TENSOR:
        return flat[spec["index"]]
    if kind == Node.CONST:
        return spec["value"]
    items = [unflatten(s, flat) for s in spec["items"]]
    if kind == Node.TUPLE:
        return tuple(items)
    if kind == Node.LIST:
        return items
    return dict(zip(spec["keys"], items))


def describe(spec: dict, meta: list[dict]) -> str:
    """One-line structure, e.g. `{last_hidden_state: float32[2, 16, 128]}`."""
    kind = spec["kind"]
    if kind == Node.TENSOR:
        m = meta[spec["index"]]
        if m is None:
            return "None"
        from aotc.artifact.schema.types import size_json
        return f"{m.dtype}[{', '.join(str(d) for d in size_json(m.shape))}]"
    if kind == Node.CONST:
        return repr(spec["value"])
    parts = [describe(s, meta) for s in spec["items"]]
    if kind == Node.DICT:
        body = ", ".join(f"{k}: {p}" for k, p in zip(spec["keys"], parts))
        return f"{spec.get('class') or ''}{{{body}}}"
    open_, close = ("(", ")") if kind == Node.TUPLE else ("[", "]")
    return open_ + ", ".join(parts) + close
