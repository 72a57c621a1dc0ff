"""The manifest's `tensor_parallel` section, typed (format 8): an artifact split over N ranks.

    "tensor_parallel": {"world_size": N,
                        "sharding": {weight: dim},     the dim of the model's tensor that is
                                                       split over the ranks (others replicated)
                        "ranks": [{"shards": [...], "map": {tensor: shard}}, ...]}

Every rank runs the same plans; each rank's weights are its own shards
(`weights-rank<R>.safetensors`, or `weights-rank<R>-0000K-of-0000N.safetensors`), holding the
same tensor names with the same shapes. The manifest's `weights` section describes rank 0's
(its `shards` and `map` are rank 0's); loading selects the caller's rank (runtime/parallel.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from aotc.artifact.schema.fields import At
from aotc.artifact.schema.files import MAX_WEIGHTS
from aotc.artifact.schema.types import WEIGHT_NAME

MAX_WORLD = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class RankWeights:
    shards: tuple
    map: dict

    def to_json(self) -> dict:
        return {"map": self.map, "shards": list(self.shards)}


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallel:
    world_size: int
    sharding: dict                   # weight name -> split dim
    ranks: tuple = ()                # RankWeights per rank (empty while codegen writes)

    def shards(self) -> tuple:
        return tuple(s for r in self.ranks for s in r.shards)

    def to_json(self) -> dict:
        return {"ranks": [r.to_json() for r in self.ranks], "sharding": self.sharding,
                "world_size": self.world_size}


def parse_parallel(a: At, weights, *, complete: bool) -> TensorParallel:
    a.obj(required=("world_size", "sharding", "ranks"))
    world = a.get("world_size").int(2, MAX_WORLD)
    sharding = {}
    for k, v in a.get("sharding").items(MAX_WEIGHTS):
        v.check(bool(WEIGHT_NAME.match(k)), "weight names", "is not a weight name")
        sharding[k] = v.int(0, 15)
    ranks = tuple(_rank(r, i) for i, r in enumerate(a.get("ranks").list(world)))
    tp = TensorParallel(world_size=world, sharding=sharding, ranks=ranks)
    if complete:
        _check(a, tp, weights)
    return tp


def _rank(a: At, rank: int) -> RankWeights:
    a.obj(required=("shards", "map"))
    own = re.compile(rf"weights-rank{rank}(?:-[0-9]{{5}}-of-[0-9]{{5}})?\.safetensors\Z")
    shards = tuple(s.str(pattern=own) for s in a.get("shards").list(100000))
    a.get("shards").check(len(set(shards)) == len(shards), "distinct shard files",
                          "lists a shard twice")
    out = {}
    for k, v in a.get("map").items(MAX_WEIGHTS):
        v.check(bool(WEIGHT_NAME.match(k)), "weight names", "is not a weight name")
        out[k] = v.str(choices=set(shards))
    return RankWeights(shards=shards, map=out)


def _check(a: At, tp: TensorParallel, weights) -> None:
    """One set of shards per rank, each holding rank 0's names, rank 0's being `weights`'."""
    a.get("ranks").check(len(tp.ranks) == tp.world_size, f"{tp.world_size} ranks' weights",
                         f"lists {len(tp.ranks)}")
    first = tp.ranks[0]
    a.get("ranks").check(first.shards == weights.shards and first.map == weights.map,
                         "rank 0's shards and index equal to the manifest's weights",
                         "disagrees with weights")
    for i, r in enumerate(tp.ranks):
        a.get("ranks").child(i, str(i)).check(set(r.map) == set(first.map),
                                              "the tensors rank 0 holds", "holds others")
    for name in tp.sharding:
        a.get("sharding").check(name in first.map, "stored tensors", f"names {name[:80]!r}")

