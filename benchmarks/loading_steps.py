"""The measurements of the loading benchmark, one per process (benchmarks/loading.py runs each
as `python -m benchmarks.loading --step NAME ...`; it prints one JSON line).

    limits        the machine's own rates: memcpy (one thread, all threads), page-cache reads
                  (parallel pread of a shard), sha256 and blake3 (one core, all cores),
                  host-to-device copies from pinned and from pageable memory (CUDA)
    export        build the model (benchmarks/bigmodels.py), aotc.export it; time, peak memory
    load          aotc.load verified and unverified, alternating, --reps each (medians): load,
                  first call, and the weights phase alone (runtime/loading.load_weights)
    memory        one aotc.load and first call: peak host memory (and device memory)
    torch.compile the model's first call under torch.compile (its cold start)
    aotinductor   torch.export + aoti_compile_and_package, then aoti_load_package + first call

Peak host memory is ru_maxrss less what the process held just before the measured step.
"""
from __future__ import annotations

import gc
import hashlib
import os
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

GIB = 1 << 30


def rss_peak() -> int:
    """This process's peak resident memory: VmHWM, which starts afresh at exec (ru_maxrss
    also counts the parent's pages at fork, as big as the driver was)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(nbytes: int, fn, reps: int = 5) -> float:
    """Bytes per second of `fn` (median of `reps` runs after one untimed run)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def limits(device: torch.device, shard: Path | None) -> dict:
    from aotc.artifact import hashing
    workers = hashing.workers()
    n = 1 * GIB
    src, dst = torch.empty(n, dtype=torch.uint8).random_(), torch.empty(n, dtype=torch.uint8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {"workers": workers, "memcpy_1t": _rate(n, lambda: dst.copy_(src))}
    torch.set_num_threads(threads)
    out["memcpy_all"] = _rate(n, lambda: dst.copy_(src))
    view, chunk = memoryview(src.numpy()), hashing.CHUNK
    spans = [view[i:i + chunk] for i in range(0, n, chunk)]
    with ThreadPoolExecutor(workers) as pool:
        out["sha256_1t"] = _rate(n // 4, lambda: hashlib.sha256(view[:n // 4]).digest(), 3)
        out["sha256_all"] = _rate(n, lambda: list(pool.map(
            lambda s: hashlib.sha256(s).digest(), spans)), 3)
        b3 = hashing.blake3_module()
        if b3 is not None:
            out["blake3_1t"] = _rate(n // 4, lambda: b3.blake3(view[:n // 4]).digest(), 3)
            out["blake3_all"] = _rate(n, lambda: list(pool.map(
                lambda s: b3.blake3(s).digest(), spans)), 3)
        if shard is not None:
            out["pagecache_read_all"] = _read_rate(shard, pool, workers)
    if device.type == "cuda":
        out.update(_h2d(device, src))
    return out


def _read_rate(path: Path, pool, workers: int) -> float:
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    bufs = [bytearray(16 << 20) for _ in range(workers)]

    def part(w):
        for lo in range(w * (16 << 20), size, workers * (16 << 20)):
            os.preadv(fd, [memoryview(bufs[w])[:min(16 << 20, size - lo)]], lo)
    try:
        return _rate(size, lambda: list(pool.map(part, range(workers))), 3)
    finally:
        os.close(fd)


def _h2d(device: torch.device, pageable: torch.Tensor) -> dict:
    pinned = torch.empty(pageable.numel(), dtype=torch.uint8, pin_memory=True)
    pinned.copy_(pageable)
    dev = torch.empty(pageable.numel(), dtype=torch.uint8, device=device)

    def copy(src):
        def run():
            dev.copy_(src, non_blocking=True)
            torch.cuda.synchronize(device)
        return run
    t0 = time.perf_counter()
    torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    return {"h2d_pinned": _rate(pageable.numel(), copy(pinned)),
            "h2d_pageable": _rate(pageable.numel(), copy(pageable)),
            "pin_alloc_1gib_s": time.perf_counter() - t0}


def export(name: str, device: torch.device, dtype: torch.dtype, out: Path,
           strict: bool = True) -> dict:
    import aotc
    from benchmarks.bigmodels import build, weight_bytes
    base = rss_now()
    t0 = time.perf_counter()
    model, inputs = build(name, device, dtype)
    built = time.perf_counter() - t0
    after_build, before_export = rss_peak(), rss_now()
    t0 = time.perf_counter()
    path = aotc.export(model, inputs, out, target=device.type, strict=strict)
    files = [p for p in Path(path).rglob("*") if p.is_file()]
    return {"build_s": built, "export_s": time.perf_counter() - t0,
            "weights_bytes": weight_bytes(model),
            "artifact_bytes": sum(p.stat().st_size for p in files),
            "shards": len([p for p in files if p.name.startswith("weights")]), "strict": strict,
            "peak_rss_build": after_build - base, "peak_rss_export": rss_peak() - base,
            # beyond what the process held when export began (the built model, on a CPU)
            "export_extra_rss": max(0, rss_peak() - before_export)}


def warm(path: Path) -> None:
    """Read every file once, so each load starts from a warm page cache."""
    for p in Path(path).rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(64 << 20):
                    pass


def load(path: Path, device: torch.device, reps: int) -> dict:
    import aotc
    from aotc.artifact.reader import Artifact
    try:
        from aotc.runtime.loading import load_weights
    except ImportError:          # an aotc before format 6 (--baseline)
        from aotc.runtime.module import load_weights
    warm(path)
    rows = {v: {"load": [], "first": [], "weights": []} for v in ("verified", "unverified")}
    for _ in range(reps):
        for label, verify in (("verified", True), ("unverified", False)):
            gc.collect()
            t0 = time.perf_counter()
            m = aotc.load(path, verify_hashes=verify)
            t1 = time.perf_counter()
            inputs = m.random_inputs()
            t2 = time.perf_counter()
            m(*inputs)
            sync(device)
            t3 = time.perf_counter()
            rows[label]["load"].append(t1 - t0)
            rows[label]["first"].append(t1 - t0 + t3 - t2)
            del m
            gc.collect()
            art = Artifact(path, verify_hashes=verify)
            t0 = time.perf_counter()
            w = load_weights(art, device)
            sync(device)
            rows[label]["weights"].append(time.perf_counter() - t0)
            del w
            art.close()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return {label: {k: statistics.median(v) for k, v in r.items()} | {"runs": r}
            for label, r in rows.items()}


def memory(path: Path, device: torch.device, verify: bool) -> dict:
    import aotc
    warm(path)
    base = rss_now()
    m = aotc.load(path, verify_hashes=verify)
    m(*m.random_inputs())
    sync(device)
    out = {"peak_rss": rss_peak() - base, "rss_after": rss_now() - base}
    if device.type == "cuda":
        out["device_peak"] = torch.cuda.max_memory_allocated(device)
    return out


def torch_compile(name: str, device: torch.device, dtype: torch.dtype) -> dict:
    from benchmarks.bigmodels import build
    model, inputs = build(name, device, dtype)
    base = rss_now()
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    with torch.no_grad():
        compiled(*inputs)
    sync(device)
    return {"first_call_s": time.perf_counter() - t0, "peak_rss": rss_peak() - base}


def aotinductor(name: str, device: torch.device, dtype: torch.dtype, out: Path) -> dict:
    from benchmarks.bigmodels import build
    model, inputs = build(name, device, dtype)
    base = rss_now()
    t0 = time.perf_counter()
    ep = torch.export.export(model, inputs)
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(out))
    build_s = time.perf_counter() - t0
    del ep, model
    gc.collect()
    t0 = time.perf_counter()
    runner = torch._inductor.aoti_load_package(package)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    runner(*inputs)
    sync(device)
    first = time.perf_counter() - t0
    return {"build_s": build_s, "load_s": load_s, "first_call_s": first,
            "load_first_s": load_s + first, "artifact_bytes": Path(package).stat().st_size,
            "peak_rss": rss_peak() - base}
