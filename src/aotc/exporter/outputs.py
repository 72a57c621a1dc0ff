"""Output flattening: the model's output structure becomes a JSON tree spec plus access paths.

The structure is read from one eager run. The model is then exported wrapped in `FlatOutputs`,
which returns the tensor leaves as a flat tuple by following the recorded paths, so the captured
graph has plain tensor outputs whatever the model returns (HF `ModelOutput`, dataclasses, dicts,
nested tuples). The runtime rebuilds the structure from the spec (`aotc.artifact.trees`).
"""
from __future__ import annotations

import dataclasses

import torch

from aotc.errors import ExportError
from aotc.artifact.trees import Node

ITEM, ATTR = "item", "attr"


def tree_spec(value, path=(), leaves=None):
    """(spec, leaf paths). Each path is a tuple of (ITEM|ATTR, key) steps from the output root."""
    leaves = [] if leaves is None else leaves
    if isinstance(value, torch.Tensor):
        leaves.append(path)
        return {"kind": Node.TENSOR.value, "index": len(leaves) - 1}, leaves
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"kind": Node.CONST.value, "value": value}, leaves
    if isinstance(value, dict):   # includes transformers' ModelOutput (an OrderedDict)
        keys = list(value.keys())
        items = [tree_spec(value[k], path + ((ITEM, k),), leaves)[0] for k in keys]
        return {"kind": Node.DICT.value, "keys": keys, "items": items,
                "class": type(value).__name__}, leaves
    if dataclasses.is_dataclass(value) or hasattr(value, "_fields"):
        keys = ([f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value)
                else list(value._fields))
        items = [tree_spec(getattr(value, k), path + ((ATTR, k),), leaves)[0] for k in keys]
        return {"kind": Node.DICT.value, "keys": keys, "items": items,
                "class": type(value).__name__}, leaves
    if isinstance(value, (tuple, list)):
        kind = Node.TUPLE if isinstance(value, tuple) else Node.LIST
        items = [tree_spec(v, path + ((ITEM, i),), leaves)[0] for i, v in enumerate(value)]
        return {"kind": kind.value, "items": items}, leaves
    where = "output" + "".join(f"[{k!r}]" if s == ITEM else f".{k}" for s, k in path)
    raise ExportError(f"the model returns a {type(value).__name__} at {where}, which aotc cannot "
                      "put in an artifact", where=where,
                      expected="tensors, or tuples/lists/dicts/dataclasses of tensors and constants",
                      found=type(value).__name__,
                      fix="return only tensors (for transformers models, set "
                          "config.use_cache=False to drop the cache object)")


def follow(value, path):
    for step, key in path:
        value = value[key] if step == ITEM else getattr(value, key)
    return value


class FlatOutputs(torch.nn.Module):
    """Wraps a model so that it returns its output leaves as a flat tuple."""

    def __init__(self, model: torch.nn.Module, paths: list[tuple]):
        super().__init__()
        self.m = model
        self.paths = tuple(paths)

    def forward(self, *args):
        out = self.m(*args)
        return tuple(follow(out, p) for p in self.paths)
