"""Weights to a GPU: shards streamed through pinned staging buffers, each chunk hashed from the
buffer it is copied from, while other chunks are read, hashed and copied on other threads.

    per worker thread (one CUDA stream and one pinned staging buffer each), for chunk j:
      read chunk j of its shard into the staging buffer        (pread: the GIL is released)
      check its digest                                         (hashing releases the GIL)
      queue asynchronous copies of its pieces into the device tensors it covers
      record an event; the buffer is refilled once the copies have passed it

Before any data chunk, the chunks holding each shard's header are read and checked by the
calling thread and the header parsed from those bytes (artifact/weights.py checks it as it
would a mapped file), so every device tensor exists, one allocation each (aligned as the
kernels expect), before its bytes arrive. Nothing is mapped: host memory holds the staging
buffers only. A digest mismatch, a short read or any other failure stops the workers; the
copies already queued are waited for, and the error is raised with the partly filled tensors
dropped. Files without chunk digests (artifacts before format 6, or re-hashed whole) are mapped,
checked whole and copied tensor by tensor instead.

On a CPU device the same pipeline runs with plain buffers and synchronous copies; the tests
exercise it there.
"""
from __future__ import annotations

import os
import threading
from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor

import torch

from aotc.errors import ArtifactError
from aotc.artifact import hashing
from aotc.artifact.shards import Loading, check_index, checked_header, shard_tensors
from aotc.artifact.weights import read_header

MAX_WORKERS = 16     # threads (each with a pinned buffer of one chunk) at most


class _Shard:
    """One shard being streamed: its descriptor, checker, device tensors and chunk pieces."""

    def __init__(self, artifact, rel: str, device: torch.device):
        self.rel = rel
        self.fd, self.checker, self.base = artifact.stream(rel)
        self.size = artifact.manifest.files[rel].size
        self.spans = self.checker.spans()
        self.tensors: dict[str, torch.Tensor] = {}
        self.first = 0            # chunks before this were read and copied with the header
        try:
            self._header(artifact, device)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read(self, index: int, view: memoryview) -> memoryview:
        """Chunk `index` read into `view` (at its start): the filled part."""
        lo, hi = self.spans[index]
        out, done = view[:hi - lo], 0
        while done < hi - lo:
            n = os.preadv(self.fd, [out[done:]], self.base + lo + done)
            if n <= 0:
                raise ArtifactError(f"artifact file {self.rel} ended while being read",
                                    where=self.checker.where, expected=f"{self.size} bytes",
                                    found=f"{lo + done} bytes", fix="re-copy the artifact")
            done += n
        return out

    def _header(self, artifact, device: torch.device) -> None:
        """Read and check the chunks holding the header, parse it, allocate the tensors."""
        head = []

        def chunk(i):
            lo, hi = self.spans[i]
            head.append(bytearray(hi - lo))
            return self.read(i, memoryview(head[-1]))
        index = checked_header(self.checker, chunk)
        raw = bytearray().join(head)
        start, header = read_header(raw, self.rel, total=self.size)
        check_index(self.rel, header, artifact.manifest.weights)
        order = sorted(header.items(), key=lambda kv: (kv[1][2], kv[1][3]))
        self.offsets = [start + lo for _, (_, _, lo, _) in order]
        self.entries = []
        for name, (dtype, shape, lo, hi) in order:
            t = torch.empty(shape, dtype=dtype, device=device)
            self.tensors[name] = t
            self.entries.append((start + lo, start + hi, t.reshape(-1).view(torch.uint8)))
        self.first = index
        source = torch.frombuffer(raw, dtype=torch.uint8) if raw else None
        for j in range(index):   # the data that came with the header
            lo = self.spans[j][0]
            for dst, s0, s1 in self.pieces(j):
                dst.copy_(source[lo + s0:lo + s1])

    def pieces(self, index: int) -> list[tuple[torch.Tensor, int, int]]:
        """(destination bytes, start, end within the chunk) of what chunk `index` carries."""
        lo, hi = self.spans[index]
        out = []
        k = max(0, bisect_right(self.offsets, lo) - 1)
        while k < len(self.entries) and self.entries[k][0] < hi:
            t_lo, t_hi, dst = self.entries[k]
            a, b = max(lo, t_lo), min(hi, t_hi)
            if a < b:
                out.append((dst[a - t_lo:b - t_lo], a - lo, b - lo))
            k += 1
        return out


class _Worker:
    """One thread's staging buffer and stream; runs the chunks it is given, in order."""

    def __init__(self, device: torch.device, size: int):
        self.cuda = device.type == "cuda"
        self.buffer = torch.empty(size, dtype=torch.uint8, pin_memory=self.cuda)
        self.view = memoryview(self.buffer.numpy())
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        if self.cuda:   # memory the allocator hands out may still be in use on that stream
            self.stream.wait_stream(torch.cuda.current_stream(device))

    def run(self, jobs: list, stop: threading.Event) -> None:
        event = None
        try:
            for shard, index in jobs:
                if stop.is_set():
                    return
                if event is not None:
                    event.synchronize()     # the buffer's last copies have left it
                data = shard.read(index, self.view)
                shard.checker.check_chunk(index, data)
                event = self._copy(shard.pieces(index))
        except BaseException:
            stop.set()
            raise
        finally:
            if event is not None:
                event.synchronize()

    def _copy(self, pieces):
        if not self.cuda:
            for dst, s0, s1 in pieces:
                dst.copy_(self.buffer[s0:s1])
            return None
        with torch.cuda.stream(self.stream):
            for dst, s0, s1 in pieces:
                dst.copy_(self.buffer[s0:s1], non_blocking=True)
            return self.stream.record_event()


def start_stream(artifact, device: torch.device, max_workers: int = MAX_WORKERS):
    """Every stored tensor of the artifact allocated on `device`, being filled by worker
    threads as the module doc describes: a shards.Loading to wait for."""
    shards, out = [], {}
    try:
        for rel in artifact.manifest.weights.shards:
            if artifact.checker(rel).chunked:
                shards.append(_Shard(artifact, rel, device))
                out.update(shards[-1].tensors)
            else:   # one digest for the whole file: it must be read whole before any use
                out.update({k: v.to(device) for k, v in shard_tensors(artifact, rel).items()})
        jobs = [(s, j) for s in shards for j in range(s.first, len(s.spans))]
        if not jobs:
            return Loading(out, closers=[s.close for s in shards])
        count = max(1, min(max_workers, hashing.workers(), len(jobs)))
        size = max(hi - lo for shard, j in jobs for lo, hi in [shard.spans[j]])
        workers = [_Worker(device, size) for _ in range(count)]
    except BaseException:
        for s in shards:
            s.close()
        raise
    stop = threading.Event()
    pool = ThreadPoolExecutor(count)
    futures = [pool.submit(w.run, jobs[i::count], stop) for i, w in enumerate(workers)]
    return Loading(out, pool, futures, stop, closers=[s.close for s in shards])


def stream_weights(artifact, device: torch.device,
                   max_workers: int = MAX_WORKERS) -> dict[str, torch.Tensor]:
    """`start_stream`, waited for: every stored tensor on `device`, every byte checked."""
    return start_stream(artifact, device, max_workers).wait()
