"""Digests of artifact files at memory speed: what export records, what loading checks.

A weights shard is hashed in fixed-size chunks (CHUNK bytes; the manifest records the size), each
with sha256 and, where the exporting host has the `blake3` package, with blake3 too
(artifact/schema/files.py). Chunks are independent, so they are hashed on all cores at once
(hashlib and blake3 release the GIL on large buffers) and each can be checked as it streams to a
GPU (runtime/transfer.py). Loading prefers blake3, about three times faster per core, where it
is importable, and checks sha256 otherwise: the manifest holds both, and a signature covers the
manifest, so either set is trusted alike. Small files and files of older artifacts carry one
sha256 of the whole file.

Every check hashes the memory that is then used: the private mapping served as CPU weights, or
the staging buffer that is copied to the device.
"""
from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from enum import Enum

from aotc.errors import ArtifactError
from aotc.artifact.schema.files import Chunks, FileEntry, chunk_count

CHUNK = 16 << 20       # large enough for full-speed copies, small enough to spread over cores
_SLICE = 1 << 24       # whole-file sha256 is fed in slices (a memoryview of any length works)


class Algorithm(str, Enum):
    SHA256 = "sha256"
    BLAKE3 = "blake3"


def blake3_module():
    """The blake3 package, or None where it is not installed (it is an optional extra)."""
    try:
        import blake3
    except ImportError:
        return None
    return blake3


def workers() -> int:
    """Threads to hash with: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def digest(view, algorithm: Algorithm) -> str:
    if algorithm is Algorithm.BLAKE3:
        return blake3_module().blake3(view).hexdigest()
    return hashlib.sha256(view).hexdigest()


def sha256_whole(data) -> str:
    h = hashlib.sha256()
    view = memoryview(data)
    for i in range(0, len(view), _SLICE):
        h.update(view[i:i + _SLICE])
    return h.hexdigest()


# ------------------------------------------------------------------------------------ writing
def file_entry(path, chunk: int) -> FileEntry:
    """The chunked entry of a file just written, hashed from the bytes on disk: chunks read
    with pread on all cores, so at most one chunk per thread is in memory (a mapping would
    count the whole file into the exporting process's resident memory)."""
    algos = [Algorithm.SHA256] + ([Algorithm.BLAKE3] if blake3_module() is not None else [])
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    local = threading.local()

    def one(lo: int) -> list[str]:
        n = min(chunk, size - lo)
        if getattr(local, "buf", None) is None:
            local.buf = bytearray(chunk)
        view = memoryview(local.buf)[:n]
        done = 0
        while done < n:
            got = os.preadv(fd, [view[done:]], lo + done)
            if got <= 0:
                raise OSError(f"{path} ended while being hashed")
            done += got
        return [digest(view, a) for a in algos]
    try:
        size = os.fstat(fd).st_size
        with ThreadPoolExecutor(workers()) as pool:
            rows = list(pool.map(one, range(0, size, chunk)))
    finally:
        os.close(fd)
    by_algo = {a: tuple(r[i] for r in rows) for i, a in enumerate(algos)}
    return FileEntry(size=size, chunks=Chunks(size=chunk, sha256=by_algo[Algorithm.SHA256],
                                              blake3=by_algo.get(Algorithm.BLAKE3)))


# ------------------------------------------------------------------------------------ checking
class Checker:
    """Checks one listed file against its entry, whole or chunk by chunk; `verify=False`
    (aotc.load(verify_hashes=False)) checks nothing."""

    def __init__(self, entry: FileEntry, where: str, rel: str, verify: bool = True):
        self.entry, self.where, self.rel, self.verify = entry, where, rel, verify
        chunks = entry.chunks
        use_blake3 = chunks is not None and chunks.blake3 is not None \
            and blake3_module() is not None
        self.algorithm = Algorithm.BLAKE3 if use_blake3 else Algorithm.SHA256

    @property
    def chunked(self) -> bool:
        return self.entry.chunks is not None

    def spans(self) -> list[tuple[int, int]]:
        """(start, end) of each chunk, or of the whole file when it has no chunk digests."""
        c, size = self.entry.chunks, self.entry.size
        if c is None:
            return [(0, size)]
        return [c.span(i, size) for i in range(chunk_count(size, c.size))]

    def check_chunk(self, index: int, view) -> None:
        """Chunk `index` (its bytes in `view`) matches its digest."""
        if not self.verify:
            return
        c = self.entry.chunks
        if c is None:
            return self._compare(sha256_whole(view), self.entry.sha256, "sha256")
        want = (c.blake3 if self.algorithm is Algorithm.BLAKE3 else c.sha256)[index]
        lo, hi = c.span(index, self.entry.size)
        self._compare(digest(view, self.algorithm), want,
                      f"{self.algorithm.value} of chunk {index} of {len(c.sha256)}, bytes "
                      f"{lo}..{hi}")

    def check_all(self, data, pool: ThreadPoolExecutor | None = None) -> None:
        """The whole file (its bytes in `data`), its chunks hashed in parallel."""
        if not self.verify:
            return
        view = memoryview(data)
        try:
            spans = self.spans()
            if len(spans) == 1:
                return self.check_chunk(0, view[spans[0][0]:spans[0][1]])
            own = pool is None
            pool = pool or ThreadPoolExecutor(min(workers(), len(spans)))
            try:
                list(pool.map(lambda i: self.check_chunk(i, view[slice(*spans[i])]),
                              range(len(spans))))
            finally:
                if own:
                    pool.shutdown()
        finally:
            view.release()

    def _compare(self, found: str, expected: str, what: str) -> None:
        if found != expected:
            raise ArtifactError(f"artifact file {self.rel} is damaged ({what} mismatch)",
                                where=self.where, expected=expected, found=found,
                                fix="re-export or re-copy the artifact")
