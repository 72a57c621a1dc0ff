"""The few-rows product kernels (codegen/triton/skinny_mm.py) against cuBLAS (torch.mm), on a
GPU, for the products of a decode step: each shape in both forms at a few tile choices (and
codegen's own), replayed as CUDA graphs of one launch per weight copy (copies rotated past L2),
median of 5; the weight's bytes over the time as GB/s. A split K's time leaves out the sums
its reader adds. (The candidates of c55c24f's results, widened tf32 operands and products on
CUDA cores, measured slower and are gone.)

    python scripts/gpu_skinny_mm.py --rows 8 [--budget-s 200]
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from aotc.codegen.triton.build import load_module
from aotc.codegen.triton.skinny_mm import plan_tiles, product_source

SHAPES = {"llama q/o": (2048, 2048), "llama k/v": (2048, 512), "llama gate/up": (2048, 5632),
          "llama down": (5632, 2048), "llama head": (2048, 32000), "gpt2 qkv": (768, 2304),
          "gpt2 fc": (768, 3072), "gpt2 proj": (3072, 768), "gpt2 attn out": (768, 768)}
HEADER = "import triton\nimport triton.language as tl\n\n"
ROTATE_BYTES = 512 << 20    # weights cycled through, so that no launch finds its weight in L2


def _load(name: str, text: str):
    """The jitted kernel `name` of a product source (compiled, never interpreted)."""
    return getattr(load_module(name, HEADER + text), name)


def _graph_time(fns: list) -> float:
    """Seconds per call, from CUDA-graph replays of one call of each of `fns` (each reading
    its own copy of the weight), median of 5."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / len(fns))
    return statistics.median(times)


def candidates(k: int, n: int) -> list:
    """(form, Tiles) to time for one shape, the forms taking turns (a deadline cuts each
    shape's list short); codegen's own choice first."""
    chosen = plan_tiles(k, n)
    out = [(chosen.form, chosen)]
    for form in ("swap", "rows"):
        for bn, bk, target in itertools.product((32, 64, 128), (64, 128), (264, 528)):
            out.append((form, plan_tiles(k, n, form, block_n=bn, block_k=bk,
                                         target=target)))
    return list(dict.fromkeys(out))


def time_shape(label, k, n, rows, deadline) -> list[str]:
    dev = torch.device("cuda")
    copies = max(2, min(256, ROTATE_BYTES // (k * n * 2)))
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
    gb = k * n * 2 / 1e9
    base = _graph_time([lambda w=w: torch.mm(x, w.t()) for w in ws])
    want = torch.mm(x.float(), ws[0].float().t())
    results = []
    for variant, t in dict.fromkeys(candidates(k, n)):
        if time.perf_counter() > deadline:
            break
        name = f"k{abs(hash((label, variant, t)))}"
        fn = _load(name, product_source(name, "x", "w", None, "o", m=rows, k=k, n=n,
                                        strides=(1, k), tiles=t))
        out = torch.empty(t.splits, rows, n, device=dev,
                          dtype=torch.bfloat16 if t.splits == 1 else torch.float32)
        grid = (n // t.block_n + (n % t.block_n > 0), t.splits)
        launch = lambda w: fn[grid](x, w, out, num_warps=4, num_stages=4)  # noqa: E731
        try:
            s = _graph_time([lambda w=w: launch(w) for w in ws])
        except Exception as e:   # a tile Triton cannot build (shared memory, registers)
            results.append((1.0, f"{variant} {t}: {type(e).__name__}"))
            continue
        launch(ws[0])
        err = (out.float().sum(0) - want).abs().max().item()
        mark = " (codegen's)" if t == plan_tiles(k, n) else ""
        results.append((s, f"{variant:4s} bn {t.block_n:3d} bk {t.block_k} splits "
                           f"{t.splits:2d}: {s * 1e6:6.1f} us {gb / s:5.0f} GB/s err "
                           f"{err:.3f}{mark}"))
    results.sort()
    head = f"== {label} K {k} N {n} ({copies} weight copies): cuBLAS {base * 1e6:.1f} us " \
           f"{gb / base:.0f} GB/s"
    best = {}
    for s, line in results:
        best.setdefault(line.split()[0], (s, line))
        if "codegen's" in line:
            best.setdefault("codegen", (s, line))
    return [head] + [f"    {line}  ({base / s:.2f}x cuBLAS)" for s, line in best.values()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=200)
    args = ap.parse_args()
    start = time.perf_counter()
    print(f"{torch.cuda.get_device_name()}; rows {args.rows}")
    for i, (label, (k, n)) in enumerate(SHAPES.items()):
        share = (args.budget_s - (time.perf_counter() - start)) / (len(SHAPES) - i)
        deadline = time.perf_counter() + share
        print("\n".join(time_shape(label, k, n, args.rows, deadline)), flush=True)


if __name__ == "__main__":
    main()
