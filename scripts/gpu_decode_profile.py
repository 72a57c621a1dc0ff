"""Where a decode step's time goes on a GPU: aotc's decode graph against torch.compile
(reduce-overhead) of the same static-cache step, kernel by kernel (torch.profiler).

    python scripts/gpu_decode_profile.py --model llama-1b --out OUT

Prints, per system, the step's wall time, the GPU time its kernels take, the kernel count, and
the kernels grouped by name (total time, count), longest first.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.generate import DTYPES, decode_time
from benchmarks.generate_models import build_model
from benchmarks.generate_systems import Aotc, Compiled


def profile(system, prompt, steps: int) -> dict:
    decode_time(system, prompt, 8)            # warm: graphs captured
    system.reset()
    logits = system.prefill(prompt)
    token = logits.argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            token = system.decode(token).argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / steps
    kernels = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name[:90]]
            k[0] += e.device_time_total / steps
            k[1] += 1
    total = sum(v[0] for v in kernels.values())
    count = sum(v[1] for v in kernels.values()) / steps
    return {"wall_us": wall * 1e6, "gpu_us": total, "kernels": count,
            "by_name": sorted(((n, t, c / steps) for n, (t, c) in kernels.items()),
                              key=lambda x: -x[1])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--cache", type=int, default=1216)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = torch.device("cuda")
    model, meta = build_model(args.model, device, DTYPES[args.dtype])
    prompt = torch.randint(0, meta["vocab"], (1, args.prompt), device=device)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        systems = {"aotc": Aotc(model, 1, args.cache, prompt, Path(tmp) / "g.aotc"),
                   "reduce-overhead": Compiled(model, 1, args.cache)}
        for name, s in systems.items():
            clean = sorted(decode_time(s, prompt, 128)[0] / 128 for _ in range(3))[1]
            r = profile(s, prompt, args.steps)
            lines.append(f"== {name}: step {clean * 1e6:.0f} us ({1 / clean:.0f} tokens/s) "
                         f"unprofiled; {r['wall_us']:.0f} us wall profiled, {r['gpu_us']:.0f} "
                         f"us in {r['kernels']:.0f} kernels")
            lines += [f"  {t:8.1f} us  x{c:4.0f}  {n}" for n, t, c in r["by_name"][:25]]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode_profile.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
