"""GPU check of generators with slots (one command, for the lead's GPU runs):

    python scripts/gpu_serve.py OUT          # writes OUT/check.json, then runs the benchmark

On the GPU: samples/llama.py (tiny, fp32) exported with --max-batch 8 (decode buckets 1, 2, 4)
for cuda; a padded batch and a continuously batched mix of requests must give each request's
tokens alone; which entries replay CUDA graphs after the run (graph_status). Then
benchmarks/serve.py over that artifact and over llama-1b in bf16 (16 slots). Records commit,
device and command in OUT/check.json and OUT/*/results.json.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def check(out: Path) -> dict:
    import aotc
    from aotc.serve.engine import Engine, SamplingParams
    from benchmarks.generate_models import _sample_module
    torch.manual_seed(0)
    net = _sample_module().Net(dim=64, layers=2, heads=4, kv_heads=2, hidden=128,
                               vocab=500).eval().cuda()
    ids = torch.randint(0, 500, (1, 8), device="cuda")
    path = aotc.export(net, (ids,), out / "tiny.aotc", decode=True, target="cuda",
                       max_cache_len=128, max_batch=8)
    m = aotc.load(path)
    prompts = [[5, 17, 3, 9, 44, 2, 71], [8, 1], [60, 61, 62, 63, 7]]
    t = max(map(len, prompts))
    batch = torch.tensor([[0] * (t - len(p)) + p for p in prompts], device="cuda")
    mask = torch.tensor([[0] * (t - len(p)) + [1] * len(p) for p in prompts], device="cuda")
    padded = m.generate(batch, 24, attention_mask=mask)[:, t:].tolist()
    alone = [m.generate(torch.tensor([p], device="cuda"), 24)[0, len(p):].tolist()
             for p in prompts]
    engine = Engine(m, prefill_chunk=4)
    asks = [([(7 * i + j) % 500 for j in range(3 + i)], 10 + 3 * i) for i in range(12)]
    rs = [engine.add(p, SamplingParams(max_tokens=n, temperature=0)) for p, n in asks]
    t0 = time.perf_counter()
    while engine.has_work():
        engine.step()
    torch.cuda.synchronize()
    batched_s = time.perf_counter() - t0
    single = [m.generate(torch.tensor([p], device="cuda"), n)[0, len(p):].tolist()
              for p, n in asks]
    return {"padded_equals_alone": padded == alone,
            "engine_equals_alone": [r.tokens for r in rs] == single,
            "engine_seconds": batched_s, "graph_status": m.graph_status(),
            "device": torch.cuda.get_device_name()}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/gpu-serve")
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.run import commit
    result = {"commit": commit()[0], "command": " ".join(sys.argv), **check(out)}
    (out / "check.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    bench = [sys.executable, "-m", "benchmarks.serve", "--device", "cuda"]
    runs = [bench + ["--artifact", str(out / "tiny.aotc"), "--out", str(out / "tiny")],
            bench + ["--model", "llama-1b", "--dtype", "bf16", "--max-batch", "16",
                     "--max-cache-len", "1024", "--out", str(out / "llama-1b-bf16")]]
    codes = [subprocess.call(r, cwd=ROOT) for r in runs]
    ok = result["padded_equals_alone"] and result["engine_equals_alone"]
    return 0 if ok and not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
