"""GPU check and measurement of serving (one command, for the lead's GPU runs):

    python scripts/gpu_serve.py OUT              # on a GPU: the check, then every benchmark
    python scripts/gpu_serve.py OUT --tiny       # the same path with tiny models only (runs on
                                                 # a CPU too: --device cpu; minutes)

The check: samples/llama.py (tiny, fp32) exported with --max-batch 8 (decode buckets 1, 2, 4);
a padded batch and a continuously batched mix of requests (sampled ones among them) must give
each greedy request's tokens alone; which entries replay CUDA graphs after the run
(graph_status). Then benchmarks/serve.py over that artifact, over llama-1b in bf16 (16 slots:
issue 47's goals, >= 5x one stream at 8 clients, ITL p99 <= 1.5x one stream's) and over
transformers' LlamaForCausalLM at the same size (hf-llama-1b, the same weights served by aotc
and run by transformers' generate over static batches). Records commit, device and command in
OUT/check.json and OUT/*/results.json (with OUT/*/throughput.png); prints a summary.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def check(out: Path, device: str) -> dict:
    import aotc
    from aotc.serve.engine import Engine, SamplingParams
    from benchmarks.generate_models import _sample_module
    torch.manual_seed(0)
    net = _sample_module().Net(dim=64, layers=2, heads=4, kv_heads=2, hidden=128,
                               vocab=500).eval().to(device)
    ids = torch.randint(0, 500, (1, 8), device=device)
    path = aotc.export(net, (ids,), out / "tiny.aotc", decode=True,
                       target="cuda" if device.startswith("cuda") else "cpu",
                       max_cache_len=128, max_batch=8, slot_buckets="1,2,4")
    m = aotc.load(path, device=device)
    prompts = [[5, 17, 3, 9, 44, 2, 71], [8, 1], [60, 61, 62, 63, 7]]
    t = max(map(len, prompts))
    batch = torch.tensor([[0] * (t - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (t - len(p)) + [1] * len(p) for p in prompts], device=device)
    padded = m.generate(batch, 24, attention_mask=mask)[:, t:].tolist()
    alone = [m.generate(torch.tensor([p], device=device), 24)[0, len(p):].tolist()
             for p in prompts]
    engine = Engine(m, prefill_chunk=4)
    asks = [([(7 * i + j) % 500 for j in range(3 + 7 * i)], 10 + 3 * i) for i in range(12)]
    rs = [engine.add(p, SamplingParams(max_tokens=n, temperature=0)) for p, n in asks]
    drawn = [engine.add(p, SamplingParams(max_tokens=n, temperature=0.8, top_p=0.9, seed=i))
             for i, (p, n) in enumerate(asks[:4])]
    t0 = time.perf_counter()
    with engine.running():
        while engine.has_work():
            engine.step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    batched_s = time.perf_counter() - t0
    single = [m.generate(torch.tensor([p], device=device), n)[0, len(p):].tolist()
              for p, n in asks]
    return {"padded_equals_alone": padded == alone,
            "engine_equals_alone": [r.tokens for r in rs] == single,
            "sampled_lengths": [len(r.tokens) for r in drawn],
            "engine_seconds": batched_s, "graph_status": m.graph_status(),
            "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"}


def runs(out: Path, device: str, tiny: bool, only: set) -> list[list[str]]:
    bench = [sys.executable, "-m", "benchmarks.serve", "--device", device]
    if tiny:
        small = ["--concurrency", "1,4", "--requests-per-client", "1", "--max-batch", "4",
                 "--max-cache-len", "128"]
        return [bench + ["--artifact", str(out / "tiny.aotc"), *small[:4],
                         "--out", str(out / "tiny")],
                bench + ["--model", "hf-tiny", *small, "--out", str(out / "hf-tiny")]]
    big = ["--dtype", "bf16", "--max-batch", "16", "--max-cache-len", "1024",
           "--concurrency", "1,4,8,16", "--requests-per-client", "4"]
    every = {"tiny": bench + ["--artifact", str(out / "tiny.aotc"), "--out", str(out / "tiny")],
             "llama-1b": bench + ["--model", "llama-1b", *big, "--out",
                                  str(out / "llama-1b-bf16")],
             "hf-llama-1b": bench + ["--model", "hf-llama-1b", *big, "--out",
                                     str(out / "hf-llama-1b-bf16")]}
    return [cmd for name, cmd in every.items() if not only or name in only]


def summary(out: Path) -> None:
    for res in sorted(out.glob("*/results.json")):
        doc = json.loads(res.read_text())
        print(f"{res.parent.name} ({doc['device']}, commit {doc['commit']}):")
        for r in doc["levels"]:
            hf = f", transformers {r['speedup_vs_transformers']:.2f}x" \
                if "speedup_vs_transformers" in r else ""
            print(f"  {r['clients']:3d} clients {r['tokens_per_s']:8.1f} tok/s "
                  f"{r['speedup']:.2f}x one at a time{hf}; ITL p99 {r['itl_p99_s'] * 1e3:.1f} "
                  f"ms (alone {r['baseline']['itl_p99_s'] * 1e3:.1f}); tokens equal "
                  f"{r['tokens_equal_baseline']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="benchmarks/results/gpu-serve")
    p.add_argument("--tiny", action="store_true", help="tiny models only (a quick run, or a "
                   "CPU's check of this script)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--only", default="", help="benchmarks to run, of tiny, llama-1b and "
                   "hf-llama-1b (default: all; split a run over two commands)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.run import commit
    result = {"commit": commit()[0], "command": " ".join(sys.argv), **check(out, args.device)}
    (out / "check.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1), flush=True)
    only = set(filter(None, args.only.split(",")))
    codes = [subprocess.call(r, cwd=ROOT) for r in runs(out, args.device, args.tiny, only)]
    summary(out)
    ok = result["padded_equals_alone"] and result["engine_equals_alone"]
    return 0 if ok and not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
