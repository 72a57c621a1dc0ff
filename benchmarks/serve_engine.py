"""The serving engine alone, in CPU time: what continuous batching saves per token, free of a
shared machine's noise (no HTTP, one torch thread, the thread's CPU time, not wall time).

    python -m benchmarks.serve_engine ARTIFACT [--concurrency 1,4,8] [--requests-per-client 4]

ARTIFACT: a generator with slots (benchmarks/serve.py exports one: `--model hf-cpu-mid`). The
requests are benchmarks/serve.py's (the same seeded mix of prompt and output lengths, greedy).
For each concurrency c: its 4c requests kept c at a time in the engine, then one at a time;
output tokens per CPU-second of each, and their ratio. On a quiet machine wall time follows
(the steps are the engine's thread's work); on a loaded one only CPU time is worth reading.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def served(module, asks: list, clients: int) -> float:
    """Output tokens per CPU-second of the engine serving `asks`, `clients` at a time."""
    from aotc.serve.engine import Engine, SamplingParams
    engine = Engine(module)
    todo, live, tokens = list(asks), [], 0
    t0 = time.thread_time()
    while todo or live:
        while todo and len(live) < clients:
            prompt, n = todo.pop(0)
            live.append(engine.add(prompt, SamplingParams(max_tokens=n, temperature=0)))
        tokens += sum(e.token is not None for e in engine.step())
        live = [r for r in live if not r.finished]
    return tokens / (time.thread_time() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact")
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--requests-per-client", type=int, default=4)
    args = p.parse_args(argv)
    import aotc
    from benchmarks.run import commit
    from benchmarks.serve import requests
    torch.set_num_threads(1)
    m = aotc.load(args.artifact, device="cpu")
    levels = [int(c) for c in args.concurrency.split(",")]
    asks = requests(max(levels) * args.requests_per_client, m.generation.vocab, m.max_cache_len)
    rows = []
    for c in levels:
        batch = asks[:c * args.requests_per_client]
        alone, together = served(m, batch, 1), served(m, batch, c)
        rows.append({"clients": c, "tokens_per_cpu_s": together, "alone": alone,
                     "speedup": together / alone})
        print(f"{c:3d} clients: {together:7.1f} tokens per CPU-second ({together / alone:.2f}x "
              f"one at a time: {alone:.1f})", flush=True)
    print(json.dumps({"commit": commit()[0], "command": " ".join(sys.argv), "levels": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
