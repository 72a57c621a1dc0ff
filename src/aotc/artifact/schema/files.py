"""The manifest's file table and weights index, typed (part of manifest.json).

A file entry gives a file's size and its digests: one sha256 of the whole file (small files, and
every file of artifacts before format 6), or digests of fixed-size chunks (weights shards):
sha256 always, blake3 too when the exporting host had it. Chunks are checked independently, so
loading hashes them over all cores and checks each as it streams to a GPU
(artifact/hashing.py, runtime/transfer.py).

The weights index says which shard files hold the stored tensors (`map`: name -> shard, as a
transformers checkpoint index does), which names are tied aliases of a stored tensor, which are
stored transposed, and which names are the model's `state_dict()` keys (parameters and
persistent buffers, tied names included); the other stored tensors are non-persistent buffers
and constants, which no state dict carries.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from aotc.artifact.schema.fields import At
from aotc.artifact.schema.types import HEX64, WEIGHT_NAME

MAX_FILE = 1 << 44
MIN_CHUNK, MAX_CHUNK = 1 << 10, 1 << 30
MAX_CHUNKS = 1 << 22
MAX_WEIGHTS = 1 << 20
SINGLE_SHARD = "weights.safetensors"
SHARD = re.compile(r"weights(?:-rank[0-9]{1,2})?(?:-[0-9]{5}-of-[0-9]{5})?\.safetensors\Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunks:
    """Digests of consecutive `size`-byte pieces of a file (the last one may be shorter)."""
    size: int
    sha256: tuple
    blake3: tuple | None = None

    def span(self, index: int, total: int) -> tuple[int, int]:
        return index * self.size, min(total, (index + 1) * self.size)

    def to_json(self) -> dict:
        out = {"sha256": list(self.sha256), "size": self.size}
        if self.blake3 is not None:
            out["blake3"] = list(self.blake3)
        return out


@dataclass(frozen=True, slots=True)
class FileEntry:
    size: int
    sha256: str | None = None
    chunks: Chunks | None = None

    def to_json(self) -> dict:
        out = {"size": self.size}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        if self.chunks is not None:
            out["chunks"] = self.chunks.to_json()
        return out


def chunk_count(size: int, chunk: int) -> int:
    return -(-size // chunk)


def parse_files(a: At, path_pattern: re.Pattern) -> dict:
    out = {}
    for path, entry in a.items(1 << 16):
        entry.check(bool(path_pattern.match(path)) and ".." not in path.split("/"),
                    "a relative path inside the artifact (letters, digits, _ . -; no ..)",
                    f"names the path {path[:200]!r}")
        entry.obj(required=("size",), optional=("sha256", "chunks"))
        size = entry.get("size").int(0, MAX_FILE)
        entry.check(entry.has("sha256") or entry.has("chunks"), "a sha256 or chunk digests",
                    "has no digest")
        sha = entry.get("sha256").str(pattern=HEX64) if entry.has("sha256") else None
        chunks = _chunks(entry.get("chunks"), size) if entry.has("chunks") else None
        out[path] = FileEntry(size=size, sha256=sha, chunks=chunks)
    return out


def _chunks(a: At, file_size: int) -> Chunks:
    a.obj(required=("size", "sha256"), optional=("blake3",))
    size = a.get("size").int(MIN_CHUNK, MAX_CHUNK)
    a.get("size").check(size & (size - 1) == 0, "a power of two", "is not a power of two")
    n = chunk_count(file_size, size)
    digests = lambda key: tuple(d.str(pattern=HEX64)   # noqa: E731
                                for d in a.get(key).list(min(n, MAX_CHUNKS), n))
    return Chunks(size=size, sha256=digests("sha256"),
                  blake3=digests("blake3") if a.has("blake3") else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Weights:
    count: int                       # names the weights resolve: stored tensors + aliases
    bytes: int
    aliases: dict                    # alias -> stored name
    transposed: tuple = ()
    shards: tuple = ()               # the files holding the stored tensors, in order
    map: dict | None = None          # stored name -> shard (None: format < 7, one shard)
    state_dict: tuple | None = None  # the model's state_dict keys (None: format < 7)

    def stored(self, name: str) -> str:
        """The stored tensor a weight name (stored or tied alias) resolves to."""
        return self.aliases.get(name, name)

    def to_json(self) -> dict:
        out = {"aliases": self.aliases, "bytes": self.bytes, "count": self.count,
               "transposed": list(self.transposed), "shards": list(self.shards)}
        if self.map is not None:
            out["map"] = self.map
        if self.state_dict is not None:
            out["state_dict"] = list(self.state_dict)
        return out


WEIGHTS_KEYS = (("count", "bytes", "aliases", "shards"), ("transposed", "map", "state_dict"))


def parse_weights(a: At) -> Weights:
    a.obj(*WEIGHTS_KEYS)
    name = lambda x: x.str(pattern=WEIGHT_NAME, max_len=1024)   # noqa: E731
    aliases = {k: name(v) for k, v in a.get("aliases").items(MAX_WEIGHTS)}
    shards = tuple(s.str(pattern=SHARD) for s in a.get("shards").list(100000))
    a.get("shards").check(len(set(shards)) == len(shards), "distinct shard files",
                          "lists a shard twice")
    w = Weights(count=a.get("count").int(0, 1 << 24), bytes=a.get("bytes").int(0, MAX_FILE),
                aliases=aliases, transposed=tuple(name(x) for x in a.get("transposed", []).list()),
                shards=shards, map=_map(a, shards), state_dict=_state_keys(a))
    _check_index(a, w)
    return w


def _map(a: At, shards: tuple) -> dict | None:
    if not a.has("map"):
        a.get("shards").check(len(shards) <= 1, "an index (map) for several shards",
                              "has several shards and no map")
        return None
    out = {}
    for k, v in a.get("map").items(MAX_WEIGHTS):
        v.check(bool(WEIGHT_NAME.match(k)), "weight names", "is not a weight name")
        out[k] = v.str(choices=set(shards))
    return out


def _state_keys(a: At) -> tuple | None:
    if not a.has("state_dict"):
        return None
    keys = tuple(x.str(pattern=WEIGHT_NAME, max_len=1024)
                 for x in a.get("state_dict").list(MAX_WEIGHTS))
    a.get("state_dict").check(len(set(keys)) == len(keys), "distinct keys", "repeats a key")
    return keys


def _check_index(a: At, w: Weights) -> None:
    """Aliases name stored tensors, state keys resolve to stored tensors, the counts agree."""
    if w.map is None:
        return
    for alias, target in w.aliases.items():
        a.get("aliases").get(alias).check(target in w.map and alias not in w.map,
                                          "an alias of a stored tensor", "names no stored tensor")
    a.get("count").check(w.count == len(w.map) + len(w.aliases),
                         f"{len(w.map) + len(w.aliases)} (stored tensors and aliases)",
                         "disagrees with the index")
    for i, key in enumerate(w.state_dict or ()):
        a.get("state_dict").child(i, key).check(w.stored(key) in w.map,
                                                "a stored tensor or an alias of one",
                                                "names no stored tensor")
    for name in w.transposed:
        a.get("transposed").check(name in w.map, "stored tensors", f"names {name[:80]!r}")
