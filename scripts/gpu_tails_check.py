"""Tails on a GPU (codegen/triton/tails.py): a decode plan whose small kernels run in the last
program of the kernel before them, against the same model's eager steps, in float32.

    python scripts/gpu_tails_check.py

For batch 1 and 2, the LLaMA sample (4 layers, width 512, vocab 32000, random weights) exported
for this GPU: how many of its kernels carry a tail, the greedy tokens of 64 steps against the
eager static-cache steps (first divergence), and the largest logit difference over the steps,
each fed the eager token (a tail that ran before its inputs were complete would show as a
difference far above float32 noise), twice over (replays of the decode graph).
"""
from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

import aotc
from aotc.exporter.generate import (DecodeStep, Generator, PrefillStep, adapt, eager_generate,
                                    reset_state, set_mode)

ROOT = Path(__file__).resolve().parents[1]


def sample():
    spec = importlib.util.spec_from_file_location("aotc_tails_llama", ROOT / "samples/llama.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.Net(layers=4, dim=512, heads=8, kv_heads=4, hidden=1408, vocab=32000).eval()


def check(batch: int, tmp: Path) -> str:
    model = sample().cuda()
    ids = torch.randint(1, 32000, (batch, 16), generator=torch.Generator().manual_seed(1)).cuda()
    cache, n = 128, 64
    with torch.no_grad():
        want = eager_generate(Generator(adapt(model, batch, cache), cache), ids, n)
        path = aotc.export(model, (ids,), tmp / f"b{batch}.aotc", decode=True,
                           max_cache_len=cache, target="cuda")
    plan = json.loads((path / "plans" / "decode.json").read_text())
    kernels = [s for s in plan["steps"] if s["kind"] == "kernel"]
    tailed = sum("_tail(" in (path / "kernels" / f"{s['name']}.py").read_text() for s in kernels)
    m = aotc.load(path)
    got = m.generate(ids, n)
    diff = (got[:, 16:] != want[:, 16:]).any(0).nonzero()
    first = int(diff[0]) if len(diff) else None
    # logits of every step fed the eager tokens, twice over (graph replays), against eager's
    g = Generator(adapt(model, batch, cache), cache)
    worst = 0.0
    for _ in range(2):
        m.reset()
        set_mode(g, "eager")
        reset_state(g)
        with torch.no_grad():
            worst = max(worst, float((m.prefill(ids) - PrefillStep(g)(ids)).abs().max()))
            for i in range(n - 1):
                tok = want[:, 16 + i:17 + i]
                worst = max(worst, float((m.decode(tok) - DecodeStep(g)(tok)).abs().max()))
    return (f"batch {batch}: {tailed} of {len(kernels)} decode kernels with tails; greedy "
            f"tokens vs eager fp32: first divergence {first} of {n}; largest logit difference "
            f"over {2 * n} steps fed eager's tokens: {worst:.2e}")


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (1, 2):
            print(check(batch, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
