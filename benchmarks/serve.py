"""Serving benchmark: `aotc serve`'s continuous batching under 1, 4, 8 and 16 concurrent clients
against the same requests sent one at a time.

    python -m benchmarks.serve --device cpu --model tiny --out benchmarks/results/cpu-serve
    python -m benchmarks.serve --device cuda --model llama-1b --dtype bf16 --max-batch 16 \\
        --out benchmarks/results/gpu-serve          # the GPU run: one command

The decoder (samples/llama.py at the named size, seeded random weights) is exported once with
`--decode --max-batch N` for the device and served by `aotc serve` on 127.0.0.1 in a process
of its own; clients are threads of this one streaming `/v1/completions` with token-id prompts
(greedy), a fixed mix of prompt and output lengths (seeded). Per concurrency:
the aggregate output tokens/s (all tokens over the wall time of the batch of requests), time
to first token and inter-token latency p50/p99 as the clients see them; the baseline is the
same requests sent one after another. Each request's tokens must equal its baseline tokens
(continuous batching changes no sequence). Writes OUT/results.json with the commit, device and
command.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SIZES = {"tiny": dict(size="small", dim=64, layers=2, heads=4, kv_heads=2, hidden=128, vocab=500),
         # ~46M parameters: a CPU decode step bound by its weights' reads, not by overhead
         "cpu-mid": dict(size="small", dim=512, layers=6, heads=8, kv_heads=2, hidden=1376,
                         vocab=32000)}


def build(args, folder: Path) -> Path:
    import aotc
    from benchmarks.generate_models import _materialize, _sample_module, build_model
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.model in SIZES:
        net = _sample_module()
        model = _materialize(lambda: net.Net(**SIZES[args.model]), device, dtype).eval()
        cos, sin = net.rotary_tables(model.config["dim"] // model.config["heads"], 4096)
        model.cos, model.sin = cos.to(device), sin.to(device)
        vocab = model.config["vocab"]
    else:
        model, meta = build_model(args.model, device, dtype)
        vocab = meta["vocab"]
    ids = torch.randint(0, vocab, (1, 8), device=device)
    target = "cuda" if device.type == "cuda" else "cpu"
    return Path(aotc.export(model, (ids,), folder / "llm.aotc", decode=True, target=target,
                            max_cache_len=args.max_cache_len, max_batch=args.max_batch,
                            slot_buckets=args.slot_buckets, record_samples=False, prove=False))


def requests(n: int, vocab: int, cache: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """n (prompt ids, output tokens): prompts of 8..cache/4 tokens, outputs of 16..cache/4."""
    rng = random.Random(seed)
    top = max(16, cache // 4)
    return [([rng.randrange(vocab) for _ in range(rng.randint(8, top))], rng.randint(16, top))
            for _ in range(n)]


def one(url: str, prompt: list[int], n: int) -> dict:
    """Stream one request; its tokens, TTFT and inter-token gaps as the client saw them."""
    import httpx
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    stamps, tokens = [], []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got = json.loads(line[6:])["choices"][0]["token_ids"]
                if got:
                    stamps.append(time.perf_counter())
                    tokens += got
    return {"tokens": tokens, "ttft": stamps[0] - t0,
            "gaps": [b - a for a, b in zip(stamps, stamps[1:])], "end": stamps[-1]}


@contextlib.contextmanager
def served(path: Path, device: str):
    """`aotc serve` on a free local port, in its own process (the clients' threads here do
    not share its interpreter); its URL once /health answers."""
    import httpx

    from aotc.serve.background import free_port
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from aotc.cli import main; main()", "serve",
                             str(path),
                             "--port", str(port), "--device", device, "--max-queue", "1024"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"aotc serve did not start (exit {proc.poll()})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(120)


def run_level(url: str, asks: list, clients: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(lambda a: one(url, *a), asks))
    wall = time.perf_counter() - t0
    pct = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else xs[0]  # noqa
    ttft = [d["ttft"] for d in done]
    gaps = [g for d in done for g in d["gaps"]]
    total = sum(len(d["tokens"]) for d in done)
    return {"clients": clients, "requests": len(asks), "output_tokens": total, "wall_s": wall,
            "tokens_per_s": total / wall, "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "itl_p50_s": pct(gaps, 50), "itl_p99_s": pct(gaps, 99),
            "_tokens": [d["tokens"] for d in done]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default="tiny", help="tiny, llama-small, llama-1b, llama-7b")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-cache-len", type=int, default=256)
    p.add_argument("--slot-buckets", default="auto", help="decode buckets (aotc export's)")
    p.add_argument("--concurrency", default="1,4,8,16")
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--artifact", default=None, help="serve this artifact instead of exporting")
    p.add_argument("--out", default="benchmarks/results/serve")
    args = p.parse_args(argv)
    import aotc
    from benchmarks.run import commit
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = Path(args.artifact) if args.artifact else build(args, Path(tmp))
        export_s = time.perf_counter() - t0
        m = aotc.load(path, device=args.device)
        levels = [int(c) for c in args.concurrency.split(",")]
        asks = requests(max(levels) * args.requests_per_client, m.generation.vocab,
                        m.max_cache_len)
        slots, cache = m.slots, m.max_cache_len
        del m
        with served(path, args.device) as url:
            one(url, *asks[0])                                        # warm up
            rows = []
            for c in levels:
                batch = asks[:c * args.requests_per_client]
                base = run_level(url, batch, 1)
                got = run_level(url, batch, c)
                same = got.pop("_tokens") == base.pop("_tokens")
                rows.append({**got, "baseline": base, "tokens_equal_baseline": same,
                             "speedup": got["tokens_per_s"] / base["tokens_per_s"]})
                print(f"{c:3d} clients: {got['tokens_per_s']:8.1f} tok/s "
                      f"({rows[-1]['speedup']:.2f}x one at a time), TTFT p50 "
                      f"{got['ttft_p50_s'] * 1e3:.1f} ms, ITL p50/p99 "
                      f"{got['itl_p50_s'] * 1e3:.1f}/{got['itl_p99_s'] * 1e3:.1f} ms "
                      f"(alone {base['itl_p50_s'] * 1e3:.1f}/{base['itl_p99_s'] * 1e3:.1f}), "
                      f"tokens equal: {same}", flush=True)
        sha, dirty = commit()
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = {"commit": sha, "modified": dirty,
              "command": " ".join(["python -m benchmarks.serve", *sys.argv[1:]]),
                  "device": torch.cuda.get_device_name() if args.device.startswith("cuda")
                  else f"cpu ({torch.get_num_threads()} threads)",
                  "model": args.model, "dtype": args.dtype, "slots": slots,
                  "max_cache_len": cache, "export_s": export_s, "levels": rows}
        (out / "results.json").write_text(json.dumps(result, indent=1))
        print(out / "results.json")
    return 0 if all(r["tokens_equal_baseline"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
