"""Programmatic dependent launch on and off, same artifact, same run: decode tokens/s and prefill
ms of one generator artifact loaded with AOTC_CUDA_PDL=1 and =0 in turn (the cubins are the
same; only the launch attribute differs), rounds interleaved, medians; and whether the two
produce the same greedy tokens.

    python scripts/gpu_pdl_ab.py --model llama-1b --batch 1 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch

import aotc
from benchmarks.generate import DTYPES, decode_time, prefill_time
from benchmarks.generate_models import build_model
from benchmarks.generate_systems import Loaded


class Switched(Loaded):
    """The artifact loaded with programmatic dependent launch on or off."""

    def __init__(self, path: Path, pdl: bool):
        os.environ["AOTC_CUDA_PDL"] = "1" if pdl else "0"
        self.m = aotc.load(path)
        os.environ.pop("AOTC_CUDA_PDL")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--cache", type=int, default=1216)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    device = torch.device("cuda")
    model, meta = build_model(args.model, device, DTYPES[args.dtype])
    prompt = torch.randint(0, meta["vocab"], (args.batch, args.prompt), device=device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.aotc"
        aotc.export(model, (prompt,), path, decode=True, max_cache_len=args.cache,
                    target="cuda")
        systems = {"pdl": Switched(path, True), "plain": Switched(path, False)}
        steps, prefill, tokens = {n: [] for n in systems}, {n: [] for n in systems}, {}
        for _ in range(args.rounds):
            for name, s in systems.items():
                seconds, tokens[name] = decode_time(s, prompt, args.steps)
                steps[name].append(seconds / args.steps)
                prefill[name].append(prefill_time(s, prompt))
        for name in systems:
            step = statistics.median(steps[name])
            print(f"{args.model} b{args.batch} {name:6s}: decode {step * 1e6:7.1f} us/step "
                  f"({args.batch / step:7.0f} tokens/s), prefill {args.prompt}: "
                  f"{statistics.median(prefill[name]) * 1e3:6.2f} ms", flush=True)
        same = torch.equal(tokens["pdl"], tokens["plain"])
        ratio = statistics.median(steps["plain"]) / statistics.median(steps["pdl"])
        print(f"  pdl/plain decode speed {ratio:.3f}x; tokens equal: {same}", flush=True)


if __name__ == "__main__":
    main()
