"""The few-rows product kernels (codegen/triton/skinny_mm.py) against cuBLAS (torch.mm), on a
GPU, for the products of a decode step: each shape at a few tile choices, replayed as CUDA
graphs of 20 launches, median of 5; the weight's bytes over the time as GB/s.

    python scripts/gpu_skinny_mm.py --rows 8 [--budget-s 200]
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from aotc.codegen.triton.skinny_mm import Tiles, combine_source, plan_tiles, product_source

SHAPES = {"llama q/o": (2048, 2048), "llama k/v": (2048, 512), "llama gate/up": (2048, 5632),
          "llama down": (5632, 2048), "llama head": (2048, 32000), "gpt2 qkv": (768, 2304),
          "gpt2 fc": (768, 3072), "gpt2 proj": (3072, 768), "gpt2 attn out": (768, 768)}
HEADER = "import triton\nimport triton.language as tl\n\n"


def _load(name: str, text: str, tmp: Path):
    path = tmp / f"{name}.py"
    path.write_text(HEADER + text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return getattr(module, name)


def _graph_time(fn, launches: int = 20, reps: int = 5) -> float:
    """Seconds per call of `fn`, from CUDA-graph replays of `launches` calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / launches)
    return statistics.median(times)


def ours(x, w, tiles: Tiles, tmp: Path, tag: str):
    """A callable running the product (and its sum) for x [M, K] and w [N, K] (read as the
    [K, N] view), and its output."""
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    part = torch.empty(tiles.splits, m, n, device=x.device, dtype=torch.float32)
    name = f"mm_{tag}"
    prod = _load(name, product_source(name, "x", "w", None, "o", m=m, k=k, n=n,
                                      strides=(1, k), tiles=tiles), tmp)
    grid = ((n + tiles.block_n - 1) // tiles.block_n, tiles.splits)
    if tiles.splits == 1:
        return (lambda: prod[grid](x, w, out, num_warps=tiles.num_warps,
                                   num_stages=tiles.num_stages)), out
    comb = _load(f"sum_{tag}", combine_source(f"sum_{tag}", "p", None, "o", m=m, n=n,
                                              splits=tiles.splits), tmp)

    def run():
        prod[grid](x, w, part, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
        comb[((m * n + 1023) // 1024,)](part, out, num_warps=4)
    return run, out


def configs(m: int, k: int, n: int):
    for bn, bk, target, stages, warps in itertools.product(
            (16, 32, 64), (128, 256), (132, 264, 528), (4,), (4,)):
        t = plan_tiles(m, k, n, block_n=bn, block_k=bk, target=target)
        yield Tiles(t.block_n, t.block_k, t.splits, t.chunk, warps, stages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=200)
    args = ap.parse_args()
    start, dev = time.perf_counter(), torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}; rows {args.rows}; default: {plan_tiles(8, 2048, 2048)}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, (k, n) in SHAPES.items():
            x = torch.randn(args.rows, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
            gb = w.numel() * 2 / 1e9
            base = _graph_time(lambda: torch.mm(x, w.t()))
            want = torch.mm(x.float(), w.float().t())
            rows, default = [], plan_tiles(args.rows, k, n)
            for i, t in enumerate(dict.fromkeys(configs(args.rows, k, n))):
                if time.perf_counter() - start > args.budget_s:
                    break
                run, out = ours(x, w, t, Path(tmp), f"{abs(hash((label, t)))}")
                s = _graph_time(run)
                err = (out.float() - want).abs().max().item()
                mark = " (default)" if (t.block_n, t.block_k, t.splits) == \
                    (default.block_n, default.block_k, default.splits) else ""
                rows.append((s, f"bn {t.block_n} bk {t.block_k} splits {t.splits} stages "
                                f"{t.num_stages}: {s * 1e6:.1f} us {gb / s:.0f} GB/s err "
                                f"{err:.3f}{mark}"))
            rows.sort()
            print(f"== {label} K {k} N {n}: cuBLAS {base * 1e6:.1f} us {gb / base:.0f} GB/s; "
                  f"best {rows[0][0] * 1e6:.1f} us ({base / rows[0][0]:.2f}x)" if rows else "")
            for _, line in rows[:4] + [r for r in rows[4:] if "default" in r[1]]:
                print("   ", line)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
