"""The quantized-weight decode kernel (codegen/triton/quant_mv.py) on a GPU, for the products of
a LLaMA-1B and a LLaMA-7B decode step: int4 (groups of 64) and int8, codegen's tiles and a few
alternatives (bytes a row per tile, programs aimed at), against cuBLAS's bf16 product of the
same shape; each replayed as CUDA graphs of one launch per weight copy (copies rotated past
L2), median of 5. GB/s counts the bytes the kernel must read (values and scales), so it reads
directly against the device's copy rate. A split K's time leaves out the sums its reader adds.

    python scripts/gpu_quant_mv.py --rows 1 [--budget-s 200]
"""
from __future__ import annotations

import argparse
import time

import torch

from aotc.artifact.quant import quantize
from aotc.codegen.triton.build import load_module
from aotc.codegen.triton import PRELUDE
from aotc.codegen.triton.quant_mv import plan_quant_tiles, quant_source
from gpu_skinny_mm import _graph_time    # (scripts/ is the path of a script run by name)

SHAPES = {"1b q/o": (2048, 2048), "1b k/v": (2048, 512), "1b gate/up": (2048, 8192),
          "1b down": (8192, 2048), "7b q/o": (4096, 4096), "7b gate/up": (4096, 11008),
          "7b down": (11008, 4096)}
ROTATE_BYTES = 512 << 20
GROUP = 64


def time_shape(label, k, n, rows, scheme, deadline) -> list[str]:
    dev = torch.device("cuda")
    w = torch.randn(n, k) / k ** 0.5
    q, s = quantize(w, scheme, GROUP if scheme == "int4" else None)
    nbytes = q.numel() * q.element_size() + (s.numel() * 4 if scheme == "int4" else 0)
    copies = max(2, min(256, ROTATE_BYTES // nbytes))
    qs = [(q.to(dev), s.to(dev)) for _ in range(copies)]
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    bf = [w.to(dev, torch.bfloat16) for _ in range(max(2, min(64, ROTATE_BYTES // (k * n * 2))))]
    base = _graph_time([lambda b=b: torch.mm(x, b.t()) for b in bf])
    lines = [f"== {label} {scheme} K {k} N {n} rows {rows}: cuBLAS bf16 {base * 1e6:.1f} us "
             f"{k * n * 2 / base / 1e9:.0f} GB/s"]
    chosen = plan_quant_tiles(rows, k, n, scheme, GROUP)
    options = [chosen] + [plan_quant_tiles(rows, k, n, scheme, GROUP, run=r, target=t)
                          for r in (32, 64, 128) for t in (264, 528, 1056)]
    for t in dict.fromkeys(options):
        if time.perf_counter() > deadline:
            break
        name = f"k{abs(hash((label, scheme, rows, t)))}"
        text = quant_source(name, "x", "w", "s" if scheme == "int4" else None, None, "o",
                            m=rows, k=k, n=n, scheme=scheme, group=GROUP, tiles=t)
        fn = getattr(load_module(name, PRELUDE + text), name)
        out = torch.empty(t.splits, rows, n, device=dev,
                          dtype=torch.bfloat16 if t.splits == 1 else torch.float32)
        grid = (-(-n // t.block_n), t.splits)
        args = (lambda q, s: (x, q, s, out)) if scheme == "int4" else (lambda q, s: (x, q, out))
        try:
            sec = _graph_time([lambda q=q, s=s: fn[grid](*args(q, s), num_warps=t.num_warps)
                               for q, s in qs])
        except Exception as e:   # a tile Triton cannot build
            lines.append(f"    {t}: {type(e).__name__}")
            continue
        mark = " (codegen's)" if t == chosen else ""
        lines.append(f"    bn {t.block_n:3d} bk {t.block_k:3d} splits {t.splits:2d}: "
                     f"{sec * 1e6:6.1f} us {nbytes / sec / 1e9:5.0f} GB/s, {base / sec:.2f}x "
                     f"cuBLAS bf16{mark}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=200)
    args = ap.parse_args()
    start = time.perf_counter()
    print(f"{torch.cuda.get_device_name()}; rows {args.rows}")
    jobs = [(label, kn, scheme) for label, kn in SHAPES.items() for scheme in ("int4", "int8")]
    for i, (label, (k, n), scheme) in enumerate(jobs):
        share = (args.budget_s - (time.perf_counter() - start)) / (len(jobs) - i)
        print("\n".join(time_shape(label, k, n, args.rows, scheme,
                                   time.perf_counter() + share)), flush=True)


if __name__ == "__main__":
    main()
