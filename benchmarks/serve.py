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


# transformers' LlamaForCausalLM at the sizes above (seeded random weights): the same weights
# served by aotc and run by transformers' generate (the static-batch baseline)
HF_SIZES = {"hf-tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=128, vocab_size=500),
            "hf-cpu-mid": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                               num_key_value_heads=2, intermediate_size=1376,
                               vocab_size=32000),
            "hf-llama-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                num_key_value_heads=8, intermediate_size=5632,
                                vocab_size=32000)}


def hf_model(name: str, device, dtype):
    import transformers

    from benchmarks.generate_models import _materialize
    cfg = transformers.LlamaConfig(**HF_SIZES[name], max_position_embeddings=4096,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = _materialize(lambda: transformers.LlamaForCausalLM(cfg), device, dtype).eval()
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg).to(device)   # real buffers
    return model


def build(args, folder: Path):
    """(artifact path, the transformers model where --model is one of HF_SIZES, else None)."""
    import aotc
    from benchmarks.generate_models import _materialize, _sample_module, build_model
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    hf = None
    if args.model in HF_SIZES:
        model = hf = hf_model(args.model, device, dtype)
        vocab = model.config.vocab_size
    elif args.model in SIZES:
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
                            slot_buckets=args.slot_buckets, record_samples=False,
                            prove=False)), hf


def static_batches(model, asks: list, batch: int, device: str) -> dict:
    """transformers' generate over static batches: the requests in arrival order, `batch` at
    a time, left-padded, greedy; a batch runs until its longest request has its tokens (the
    others' extra tokens are not counted). Aggregate tokens/s and each request's tokens."""
    tokens, total = [], 0
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    for i in range(0, len(asks), batch):
        group = asks[i:i + batch]
        width = max(len(p) for p, _ in group)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in group], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group],
                            device=device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                                 max_new_tokens=max(n for _, n in group), min_new_tokens=1)
        sync()
        for row, (_, n) in zip(out[:, width:].tolist(), group):
            tokens.append(row[:n])
            total += n
    wall = time.perf_counter() - t0
    return {"batch": batch, "output_tokens": total, "wall_s": wall,
            "tokens_per_s": total / wall, "_tokens": tokens}


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


def warm_up(url: str, asks: list, clients: int, cache: int, device: str) -> None:
    """A request, and on a GPU a prompt whose chunks have every power-of-two length up to 64
    twice (the engine's prefill graphs are captured on a length's second call) and the
    clients at once (the decode buckets' graphs)."""
    one(url, *asks[0])
    if device.startswith("cuda"):
        for _ in range(2):
            one(url, [1] * min(127, cache - 2), 1)
        run_level(url, [(p, 4) for p, _ in asks[:clients]], clients)


def level(url: str, batch: list, c: int, hf, device: str) -> dict:
    """One concurrency: the requests one at a time, then `c` clients at once, then (with a
    transformers model) its generate over static batches of `c`."""
    base = run_level(url, batch, 1)
    got = run_level(url, batch, c)
    got_tokens = got.pop("_tokens")
    same = got_tokens == base.pop("_tokens")
    row = {**got, "baseline": base, "tokens_equal_baseline": same,
           "speedup": got["tokens_per_s"] / base["tokens_per_s"]}
    print(f"{c:3d} clients: {got['tokens_per_s']:8.1f} tok/s ({row['speedup']:.2f}x one at a "
          f"time), TTFT p50 {got['ttft_p50_s'] * 1e3:.1f} ms, ITL p50/p99 "
          f"{got['itl_p50_s'] * 1e3:.1f}/{got['itl_p99_s'] * 1e3:.1f} ms (alone "
          f"{base['itl_p50_s'] * 1e3:.1f}/{base['itl_p99_s'] * 1e3:.1f}), tokens equal: {same}",
          flush=True)
    if hf is not None:
        ref = static_batches(hf, batch, c, device)
        row["transformers"] = {**ref, "tokens_equal": ref.pop("_tokens") == got_tokens}
        row["speedup_vs_transformers"] = got["tokens_per_s"] / ref["tokens_per_s"]
        print(f"     transformers generate, static batches of {c}: {ref['tokens_per_s']:8.1f} "
              f"tok/s (aotc {row['speedup_vs_transformers']:.2f}x)", flush=True)
    return row


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
    p.add_argument("--no-transformers", action="store_true", help="with an hf-* model, leave "
                   "out transformers' static-batch baseline")
    p.add_argument("--artifact", default=None, help="serve this artifact instead of exporting")
    p.add_argument("--out", default="benchmarks/results/serve")
    args = p.parse_args(argv)
    import aotc
    from benchmarks.run import commit
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path, hf = (Path(args.artifact), None) if args.artifact else build(args, Path(tmp))
        export_s = time.perf_counter() - t0
        hf = None if args.no_transformers else hf
        m = aotc.load(path, device=args.device)
        levels = [int(c) for c in args.concurrency.split(",")]
        asks = requests(max(levels) * args.requests_per_client, m.generation.vocab,
                        m.max_cache_len)
        slots, cache = m.slots, m.max_cache_len
        del m
        with served(path, args.device) as url:
            warm_up(url, asks, max(levels), cache, args.device)
            if hf is not None:
                static_batches(hf, asks[:2], 2, args.device)
            rows = [level(url, asks[:c * args.requests_per_client], c, hf, args.device)
                    for c in levels]
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
        from benchmarks.plot import plot_serving
        plot_serving(result, out / "throughput.png")
        print(out / "results.json")
    return 0 if all(r["tokens_equal_baseline"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
