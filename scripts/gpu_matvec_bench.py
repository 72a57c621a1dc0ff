"""Products of one row on a GPU (a decode step's projections at batch 1): achieved bandwidth of
Triton matrix-vector kernels by block shape, warps and K split, against cuBLAS (F.linear) and
the device's copy rate, measured in the same run; and the cost of one more kernel in a CUDA
graph (a decode step launches about 200).

    python scripts/gpu_matvec_bench.py [--shapes 3072x2048,2048x2048,11264x2048,2048x5632]

Each product rotates over enough weight copies (> 2x L2) that every launch reads its weight
from HBM, as a decode step does (each layer's weights are read once per token). Times: CUDA
events around a CUDA graph of back-to-back launches, median of 5.
"""
from __future__ import annotations

import argparse
import itertools
import statistics

import torch
import triton
import triton.language as tl

L2_BYTES = 60 << 20


@triton.jit
def _matvec(x_ptr, w_ptr, out_ptr, N, K, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
            SPLIT: tl.constexpr):
    rows = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    chunk = K // SPLIT
    lo = tl.program_id(1) * chunk
    acc = tl.zeros([XBLOCK, RBLOCK], tl.float32)
    row_mask = rows[:, None] < N
    for k0 in range(lo, lo + chunk, RBLOCK):
        r = k0 + tl.arange(0, RBLOCK)
        w = tl.load(w_ptr + rows[:, None] * K + r[None, :],
                    mask=row_mask & (r[None, :] < lo + chunk), other=0.0,
                    eviction_policy="evict_first")
        x = tl.load(x_ptr + r, mask=r < lo + chunk, other=0.0, eviction_policy="evict_last")
        acc += w.to(tl.float32) * x[None, :].to(tl.float32)
    s = tl.sum(acc, 1)
    if SPLIT == 1:
        tl.store(out_ptr + rows, s.to(out_ptr.dtype.element_ty), mask=rows < N)
    else:
        tl.atomic_add(out_ptr + rows, s, mask=rows < N, sem="relaxed")


@triton.jit
def _tiny(ptr):
    tl.store(ptr + tl.program_id(0), tl.load(ptr + tl.program_id(0)) + 1)


def graph_time(fn, reps: int = 20) -> float:
    """Seconds per `fn()` call, from a CUDA graph of `reps` calls."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        g.replay()
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / reps)
    return statistics.median(times)


def copy_rate() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / graph_time(lambda: dst.copy_(src), reps=5)


def bench_shape(n: int, k: int, rate: float) -> list[str]:
    wbytes = n * k * 2
    copies = max(2, -(-2 * L2_BYTES // wbytes))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    out32 = torch.zeros(n, device="cuda", dtype=torch.float32)
    out16 = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    want = (x.float() @ ws[0].float().T).view(-1)
    it = itertools.cycle(ws)
    rows = []

    def report(name, fn):
        t = graph_time(fn)
        rows.append((t, f"  {name:34s} {t * 1e6:7.2f} us  {wbytes / t / 1e12:5.2f} TB/s  "
                        f"{wbytes / t / rate * 100:5.1f}% of copy rate"))
    report("cuBLAS F.linear", lambda: torch.nn.functional.linear(x, next(it)))
    for xb, rb, warps, split in itertools.product((1, 2, 4, 8), (512, 1024, 2048), (4, 8),
                                                  (1, 2, 4)):
        if xb * rb > 8192 or k % split or k // split < rb // 2:
            continue
        grid = (triton.cdiv(n, xb), split)
        out = out16 if split == 1 else out32

        def run(xb=xb, rb=rb, warps=warps, split=split, out=out, grid=grid, w=None):
            if split > 1:
                out.zero_()
            _matvec[grid](x, next(it) if w is None else w, out, n, k, xb, rb, split,
                          num_warps=warps)
        try:
            run(w=ws[0])     # checked against the product with this weight
            torch.cuda.synchronize()
            got = out.float()
            err = float((got - want).abs().max() / want.abs().max())
            if err > 2e-2:
                rows.append((1.0, f"  x{xb} r{rb} w{warps} s{split}: WRONG ({err:.3g})"))
                continue
            report(f"triton x{xb} r{rb} w{warps} split{split}", run)
        except Exception as e:   # noqa: BLE001 - a config that does not compile is skipped
            rows.append((1.0, f"  x{xb} r{rb} w{warps} s{split}: {type(e).__name__}"))
    rows.sort()
    return [f"{n}x{k} ({wbytes / 1e6:.1f} MB):"] + [r for _, r in rows[:12]]


def launch_gap() -> str:
    buf = torch.zeros(1024, device="cuda")
    one = graph_time(lambda: _tiny[(1,)](buf), reps=1)
    many = graph_time(lambda: _tiny[(1,)](buf), reps=200)
    return (f"tiny kernel in a CUDA graph: {many * 1e6:.2f} us each in a chain of 200 "
            f"(alone: {one * 1e6:.2f} us)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="3072x2048,2048x2048,11264x2048,2048x5632,32000x2048")
    args = p.parse_args()
    rate = copy_rate()
    print(f"{torch.cuda.get_device_name()}: copy rate {rate / 1e12:.2f} TB/s "
          f"(read + written)", flush=True)
    print(launch_gap(), flush=True)
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        print("\n".join(bench_shape(n, k, rate)), flush=True)


if __name__ == "__main__":
    main()
