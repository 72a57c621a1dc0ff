"""Generation benchmark: decode tokens/s and prefill latency of generator artifacts against the
same static-cache steps run eagerly and under torch.compile(mode="reduce-overhead").

    python -m benchmarks.generate --device cuda --dtype bf16 --models llama-1b,gpt2 \\
        --batches 1,8 --prompts 128,1024 --out benchmarks/results/h200-generate
    python -m benchmarks.generate --device cpu --models llama-small --batches 1 \\
        --prompts 128 --threads 1 --out benchmarks/results/cpu-generate

Per model and batch, in one process: the decoder is built with seeded random weights in the run
dtype, exported with `decode=True`, and the three systems run the same steps (exporter/
generate.py's PrefillStep/DecodeStep over the same caches: transformers' own model code for
transformers models; eager and reduce-overhead attend the whole cache with a mask, as a static
cache does). Decode is timed as `--steps` greedy steps after a prefill, each system through its
own greedy loop (benchmarks/generate_systems.py: the argmax inside the step, compiled with it
for reduce-overhead; aotc's `stream`, one fused graph replay a token on a GPU), prefill at each
prompt length, both interleaved across systems, medians of `--repeats`.
The roofline of a decode step is the bytes it must read (every weight once, plus the live
part of the cache) over the device's copy rate measured in the same run (`copy_` of a large
buffer: bytes read plus written, per second); aotc's fraction of it is reported. Greedy tokens
of aotc are compared with eager's (the first divergence is reported; bf16 ties may flip).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.generate_models import build_model
from benchmarks.generate_systems import Aotc, Compiled, Eager

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_rate(device: torch.device) -> float:
    """Bytes per second a large device-to-device copy moves (read plus written)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 28)
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    times = []
    for _ in range(7):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n / statistics.median(times[2:])


def decode_time(system, prompt: torch.Tensor, steps: int) -> tuple[float, torch.Tensor]:
    """(seconds for `steps` greedy decode steps after a prefill, the tokens)."""
    device = prompt.device
    system.reset()
    logits = system.prefill(prompt)
    tokens = [logits.argmax(-1, keepdim=True)]
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        tokens.append(system.decode(tokens[-1]).argmax(-1, keepdim=True))
    sync(device)
    return time.perf_counter() - t, torch.cat(tokens, dim=1)


def greedy_time(system, prompt: torch.Tensor, steps: int) -> tuple[float, torch.Tensor]:
    """(seconds for `steps` greedy decode steps after a prefill, the tokens), through the
    system's own greedy loop (`system.greedy`, benchmarks/generate_systems.py)."""
    device = prompt.device
    system.reset()
    loop = system.greedy(prompt, steps + 1)
    tokens = [next(loop)]
    sync(device)
    t = time.perf_counter()
    tokens.extend(loop)
    sync(device)
    return time.perf_counter() - t, torch.cat(tokens, dim=1)


def prefill_time(system, prompt: torch.Tensor) -> float:
    system.reset()
    sync(prompt.device)
    t = time.perf_counter()
    system.prefill(prompt)
    sync(prompt.device)
    return time.perf_counter() - t


def interleaved(systems: dict, fn, repeats: int) -> dict:
    """{name: [result...]}: `fn(system)` for every system, one round after another."""
    out = {n: [] for n in systems}
    for r in range(repeats):
        names = list(systems)[r % len(systems):] + list(systems)[:r % len(systems)]
        for n in names:
            out[n].append(fn(systems[n]))
    return out


def first_divergence(a: torch.Tensor, b: torch.Tensor) -> int | None:
    differ = (a.cpu() != b.cpu()).any(0).nonzero()
    return None if len(differ) == 0 else int(differ[0])


def bench_point(name: str, batch: int, args, device, dtype, rate: float) -> dict:
    model, meta = build_model(name, device, dtype)
    longest = max(args.prompts) + args.steps + 2
    cache = int(math.ceil(longest / 64) * 64)
    gen = torch.Generator().manual_seed(0)
    prompts = {t: torch.randint(0, meta["vocab"], (batch, t), generator=gen).to(device)
               for t in args.prompts}
    with tempfile.TemporaryDirectory(prefix="aotc-gen-") as tmp:
        systems = {"eager": Eager(model, batch, cache),
                   "reduce-overhead": Compiled(model, batch, cache),
                   "aotc": Aotc(model, batch, cache, prompts[args.prompts[0]],
                                Path(tmp) / "g.aotc", args.target)}
        first = args.prompts[0]
        for s in systems.values():   # warm up: compile, capture graphs, fill caches
            for _ in range(2):
                greedy_time(s, prompts[first], 4)
                for p in prompts.values():
                    prefill_time(s, p)
        dec = interleaved(systems, lambda s: greedy_time(s, prompts[first], args.steps),
                          args.repeats)
        pre = {t: interleaved(systems, lambda s: prefill_time(s, p), args.repeats)
               for t, p in prompts.items()}
        cold = systems["aotc"].cold
    decode_s = {n: statistics.median(t for t, _ in r) for n, r in dec.items()}
    tokens = {n: r[0][1] for n, r in dec.items()}
    live = meta["kv_bytes_per_token"] * batch * (first + args.steps / 2)
    roofline = (meta["weight_bytes"] + live) / rate
    step = {n: s / args.steps for n, s in decode_s.items()}
    return {"model": name, "batch": batch, "params": meta["params"], "cache": cache,
            "decode_tokens_per_s": {n: batch / v for n, v in step.items()},
            "decode_step_ms": {n: v * 1e3 for n, v in step.items()},
            "prefill_ms": {str(t): {n: statistics.median(v) * 1e3 for n, v in r.items()}
                           for t, r in pre.items()},
            "roofline_step_ms": roofline * 1e3,
            "roofline_fraction": {n: roofline / v for n, v in step.items()},
            "first_divergence_vs_eager": {n: first_divergence(tokens[n], tokens["eager"])
                                          for n in tokens if n != "eager"},
            "decode_launches": cold["decode_launches"],
            "export_s": cold["export_s"], "load_s": cold["load_s"],
            "load_first_token_s": cold["load_first_token_s"]}


def table(rows: list[dict]) -> str:
    lines = ["| model | batch | eager tok/s | reduce-overhead tok/s | aotc tok/s | aotc/ro | "
             "roofline | prefill ms (eager / ro / aotc) | load+1st token |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        t = r["decode_tokens_per_s"]
        pre = "; ".join(f"{p}: {v['eager']:.1f} / {v['reduce-overhead']:.1f} / {v['aotc']:.1f}"
                        for p, v in r["prefill_ms"].items())
        lines.append(f"| {r['model']} | {r['batch']} | {t['eager']:.0f} | "
                     f"{t['reduce-overhead']:.0f} | {t['aotc']:.0f} | "
                     f"{t['aotc'] / t['reduce-overhead']:.2f}x | "
                     f"{r['roofline_fraction']['aotc'] * 100:.0f}% | {pre} | "
                     f"{r['load_first_token_s'] * 1e3:.0f} ms |")
    return "\n".join(lines)


def parse(argv=None, extra=None, *, batches: str = "1"):
    """The command line; `extra(parser)` adds a benchmark's own flags (benchmarks/quant.py)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--models", default="llama-small")
    p.add_argument("--batches", default=batches)
    p.add_argument("--prompts", default="128")
    p.add_argument("--steps", type=int, default=128, help="decode steps timed")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--target", default=None, help="aotc target (default: the device)")
    p.add_argument("--commit", default=None, help="the commit measured, if not a git checkout")
    p.add_argument("--out", type=Path, default=None)
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    args.prompts = [int(x) for x in args.prompts.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def main(argv=None) -> None:
    run_points(parse(argv), bench_point, write)


def run_points(args, point, write) -> None:
    """`point(model, batch, args, device, dtype, rate)` for every model and batch, the results
    written after each (a run cut short keeps what it did)."""
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    rate = copy_rate(device)
    rows = []
    for m in args.models.split(","):
        for b in args.batches.split(","):
            rows.append(point(m, int(b), args, device, dtype, rate))
            write(args, rows, rate)


def write(args, rows: list, rate: float, *, benchmark: str = "generation",
          module: str = "benchmarks.generate", table=table) -> None:
    import sys
    from benchmarks.run import commit
    rev, modified = commit()
    meta = {"benchmark": benchmark, "command": " ".join([f"python -m {module}", *sys.argv[1:]]),
            "commit": args.commit or rev, "modified": [] if args.commit else modified,
            "device": args.device,
            "dtype": args.dtype, "torch": torch.__version__, "copy_rate_gb_s": rate / 1e9,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}
    text = table(rows)
    print(text, flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                          indent=1))
        (args.out / "results.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
