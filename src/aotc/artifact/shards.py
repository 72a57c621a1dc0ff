"""Weights shards: safetensors files written one tensor at a time, and read back verified.

Writing (export, `aotc swap-weights`): the stored tensors are ordered as safetensors orders them
(largest item size first, then by name, so each tensor starts at a multiple of its item size),
cut into shards of at most `cap` bytes (a tensor larger than the cap gets a shard of its own),
and each shard is written tensor by tensor: beside the model, only the contiguous host copy of
the tensor being written exists, so export's peak memory stays near one copy of the weights.
Each shard is then hashed in chunks over all cores from the bytes on disk (artifact/hashing.py).
One shard is `weights.safetensors`; several are `weights-00001-of-0000N.safetensors`, with an
index (`map`: tensor -> shard) in the manifest, as transformers shards checkpoints. The files
are plain safetensors: any safetensors reader opens them.

Reading on the CPU: each shard is a private mapping; the chunks holding its header are checked
before the header is parsed, which must name exactly the tensors the index places in the shard,
and the other chunks are checked on all cores while the caller builds its plans (`Loading`).
GPU loading streams the shards instead (runtime/transfer.py).
"""
from __future__ import annotations

import json
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from aotc.errors import ArtifactError
from aotc.artifact import hashing
from aotc.artifact.schema.files import SINGLE_SHARD
from aotc.artifact.weights import CODES, MAX_HEADER, tensors

DEFAULT_CAP = 2 << 30


def shard_name(index: int, count: int, prefix: str = "weights") -> str:
    """`prefix`: weights-rank<R> for the shards of one rank (tensor-parallel artifacts)."""
    if count == 1:
        return SINGLE_SHARD if prefix == "weights" else f"{prefix}.safetensors"
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.safetensors"


@dataclass(frozen=True, slots=True)
class Lazy:
    """A tensor to be made when its shard is written (a cast or a transpose of a tensor held
    elsewhere), so that only one such copy exists at a time."""
    shape: tuple
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]


def _meta(t) -> tuple[tuple, torch.dtype]:
    return tuple(t.shape), t.dtype


def _nbytes(t) -> int:
    shape, dtype = _meta(t)
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def layout(stored: dict, cap: int = DEFAULT_CAP) -> list[list[str]]:
    """The names of `stored` (name -> tensor or Lazy) in each shard, in file order."""
    order = sorted(stored, key=lambda n: (-_meta(stored[n])[1].itemsize, n))
    shards, size = [[]], 0
    for name in order:
        n = _nbytes(stored[name])
        if shards[-1] and size + n > cap:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards if shards[0] else []


def _header(names: list[str], stored: dict) -> bytes:
    entries, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in names:
        shape, dtype = _meta(stored[name])
        if dtype not in CODES:
            raise ArtifactError(f"weight {name!r} is {dtype}, which aotc's weights files do "
                                "not store", where=name, expected=sorted(map(str, CODES)),
                                found=str(dtype), fix="cast the weight to a supported dtype "
                                "before export")
        n = _nbytes(stored[name])
        entries[name] = {"dtype": CODES[dtype], "shape": list(shape),
                         "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)      # tensors start 8-aligned, as safetensors writes them
    return struct.pack("<Q", len(raw)) + raw


def _host_bytes(t) -> memoryview:
    """The tensor's bytes, contiguous in host memory (made now if it is Lazy)."""
    t = t.make() if isinstance(t, Lazy) else t
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())


def write_shards(directory: Path, stored: dict, cap: int = DEFAULT_CAP,
                 chunk: int | None = None, prefix: str = "weights") -> tuple[dict, dict]:
    """Write `stored` (name -> tensor or Lazy) as shards under `directory`:
    ({shard file: FileEntry}, {name: shard file}); `chunk`: bytes per digest (hashing.CHUNK);
    `prefix`: the shards' names (`shard_name`)."""
    chunk = chunk or hashing.CHUNK
    groups = layout(stored, cap)
    files, index = {}, {}
    for i, names in enumerate(groups):
        rel = shard_name(i, len(groups), prefix)
        path = Path(directory) / rel
        with open(path, "wb") as f:
            f.write(_header(names, stored))
            for name in names:
                f.write(_host_bytes(stored[name]))
        files[rel] = hashing.file_entry(path, chunk)
        index.update((name, rel) for name in names)
    return files, index


# ---------------------------------------------------------------------------------- reading
def check_index(rel: str, names, weights) -> None:
    """A shard's header names exactly the tensors the manifest's index places in it."""
    if weights.map is None:
        return
    want = {n for n, shard in weights.map.items() if shard == rel}
    got = set(names)
    if got != want:
        odd = sorted(got ^ want)[0]
        raise ArtifactError(f"weights shard {rel} does not hold the tensors the index places "
                            "in it", where=f"{rel}, tensor {odd[:80]!r}",
                            expected=f"{len(want)} tensors as manifest weights.map lists",
                            found=f"{len(got)} tensors ({odd[:80]!r} "
                                  f"{'unlisted' if odd in got else 'missing'})",
                            fix="re-export the model; do not mix shards of two artifacts")


def shard_tensors(artifact, rel: str) -> dict[str, torch.Tensor]:
    """The tensors of one shard, as views of its verified private mapping."""
    part = tensors(artifact.mapped(rel), rel)
    check_index(rel, part, artifact.manifest.weights)
    return part


def stored_tensors(artifact) -> dict[str, torch.Tensor]:
    """Every stored tensor of the artifact, as a view of its shard's verified private mapping."""
    out: dict[str, torch.Tensor] = {}
    for rel in artifact.manifest.weights.shards:
        out.update(shard_tensors(artifact, rel))
    return out


class Loading:
    """Weights being loaded (`start_weights`): `weights` exist at once, by every name the plans
    use, while worker threads check their bytes (and on a GPU copy them); `wait()` returns them
    once every byte was checked, or raises the first failure. Nothing may compute with them
    before: a CompiledModule builds its plans meanwhile and recomputes, after `wait()`, what
    those derived from weights (executor.PlanFunction.refresh)."""

    def __init__(self, weights: dict, pool=None, futures=(), stop=None, closers=()):
        self.weights, self.pool, self.futures = weights, pool, list(futures)
        self.stop, self.closers = stop or threading.Event(), list(closers)

    @property
    def pending(self) -> bool:
        """Whether bytes were still being checked or copied when the weights were handed out
        (then what was computed from them meanwhile must be computed again)."""
        return bool(self.futures)

    def wait(self) -> dict:
        try:
            for f in self.futures:
                f.result()
        finally:
            self.close()
        return self.weights

    def close(self) -> None:
        """Stop the workers (after a failure elsewhere) and release what they held."""
        self.stop.set()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
        for close in self.closers:
            close()
        self.closers = []


def checked_header(checker, chunk) -> int:
    """Check a shard's chunks from the first until they hold its safetensors header (every
    chunk, for a file with one digest): how many were checked. `chunk(i)`: chunk i's bytes."""
    spans, need = checker.spans(), 8
    for i, (_, hi) in enumerate(spans):
        view = chunk(i)
        checker.check_chunk(i, view)
        if i == 0 and len(view) >= 8:
            need = 8 + int.from_bytes(bytes(view[:8]), "little")
        if hi >= need or need > 8 + MAX_HEADER:   # read_header refuses a length past the end
            return i + 1
    return len(spans)


def start_mapped(artifact) -> Loading:
    """CPU: each shard mapped privately, its header chunks checked now, the rest on all cores;
    the tensors are views of the mapping that is being hashed."""
    weights, checks = {}, []
    for rel in artifact.manifest.weights.shards:
        data, checker = artifact.mapping(rel)
        view = memoryview(data)
        spans = checker.spans()
        first = checked_header(checker, lambda i: view[spans[i][0]:spans[i][1]])
        part = tensors(data, rel)
        check_index(rel, part, artifact.manifest.weights)
        weights.update(part)
        if artifact.verify_hashes:
            checks += [(checker, i, view[lo:hi]) for i, (lo, hi) in enumerate(spans)
                       if i >= first]
    if not checks:
        return Loading(weights)
    stop = threading.Event()
    pool = ThreadPoolExecutor(min(hashing.workers(), len(checks)))
    futures = [pool.submit(_check, stop, *c) for c in checks]
    return Loading(weights, pool, futures, stop)


def _check(stop: threading.Event, checker, index: int, view) -> None:
    if not stop.is_set():
        checker.check_chunk(index, view)


def resolve_aliases(weights: dict, manifest) -> dict:
    """`weights` (stored name -> tensor) with every tied alias pointing at its tensor."""
    for alias, original in manifest.weights.aliases.items():
        if original not in weights:
            raise ArtifactError(f"weight alias {alias!r} names {original!r}, which the weights "
                                "file lacks", where="manifest weights.aliases",
                                expected="a stored weight", found=original,
                                fix="re-export the model")
        weights[alias] = weights[original]
    return weights
