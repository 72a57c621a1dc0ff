"""GPU checks of the fused greedy step (runtime/greedy.py) and of export's memory.

    python scripts/gpu_greedy.py ab --model llama-1b [--rounds 10] [--batch 1]
    python scripts/gpu_greedy.py sampled --model llama-1b [--rounds 10]
    python scripts/gpu_greedy.py export-memory --model llama-1b

`ab`: one artifact, loaded once; rounds alternate 128 greedy steps after a 128-token prompt
driven the plain way (decode, then an eager argmax, as benchmarks/generate.py drove every
system before) and through `m.stream` (the fused step: one graph replay a token). Prints each
way's median step, the ratio, and whether the tokens are the same.

`sampled`: the same, with sampled steps (top_k 50, top_p 0.9, one seed) through `m.stream`,
alternating index flags read after every step (`fold_flags = False`) and folded, read every 16
(runtime/graphs.py StickyFlag).

`export-memory`: the model built on the GPU in bf16, exported as a generator; the GPU memory
export allocated beyond the model (torch.cuda.max_memory_allocated), and whether this torch's
Dynamo copies through the function exporter/capture.py replaces. Run it with each tree's aotc
importable to compare them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
PROMPT, STEPS = 128, 128
CACHE = {"llama-1b": 1216, "gpt2": 320}


def _model(name: str, device):
    from benchmarks.generate_models import build_model
    torch.manual_seed(0)
    model, meta = build_model(name, device, torch.bfloat16)
    return model, meta["vocab"]


def _plain(m, prompt) -> tuple[float, torch.Tensor]:
    from benchmarks.generate import decode_time
    seconds, tokens = decode_time(m, prompt, STEPS)
    return seconds / STEPS, tokens


def _fused(m, prompt, **sampling) -> tuple[float, torch.Tensor]:
    """(seconds a step, tokens) of STEPS steps of `m.stream` after its first token."""
    m.reset()
    steps = m.stream(prompt, STEPS + 1, **sampling)
    tokens = [next(steps)]
    torch.cuda.synchronize()
    t = time.perf_counter()
    tokens += list(steps)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / STEPS, torch.cat(tokens, 1)


def ab(args) -> None:
    import aotc
    model, vocab = _model(args.model, torch.device("cuda"))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (args.batch, PROMPT), generator=g).cuda()
    path = Path("/tmp/aotc-greedy") / f"{args.model}-b{args.batch}.aotc"
    aotc.export(model, (prompt,), path, decode=True, max_cache_len=CACHE[args.model],
                target="cuda")
    del model
    m = aotc.load(path)
    ways = {"plain": _plain, "fused": _fused} if args.what == "ab" else \
        {"plain": _sampled(False), "fused": _sampled(True)}
    tokens = {n: f(m, prompt)[1] for n, f in ways.items()}     # warm: graphs captured
    times = {n: [] for n in ways}
    for r in range(args.rounds):
        for n in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            times[n].append(ways[n](m, prompt)[0])
    med = {n: statistics.median(t) for n, t in times.items()}
    same = torch.equal(tokens["plain"], tokens["fused"])
    print(json.dumps({"what": args.what, "model": args.model, "batch": args.batch,
                      "rounds": args.rounds,
                      "plain_us": round(med["plain"] * 1e6, 1),
                      "fused_us": round(med["fused"] * 1e6, 1),
                      "plain_over_fused": round(med["plain"] / med["fused"], 4),
                      "spread_us": {n: [round(min(t) * 1e6, 1), round(max(t) * 1e6, 1)]
                                    for n, t in times.items()},
                      "same_tokens": same, "fused_status": m.greedy.status() if m.greedy else None,
                      "device": torch.cuda.get_device_name()}))


def _sampled(fold: bool):
    def run(m, prompt) -> tuple[float, torch.Tensor]:
        m.fold_flags = fold
        return _fused(m, prompt, do_sample=True, top_k=50, top_p=0.9,
                      generator=torch.Generator("cuda").manual_seed(0))
    return run


def export_memory(args) -> None:
    import aotc
    from torch._dynamo.variables import builder
    device = torch.device("cuda")
    model, vocab = _model(args.model, device)
    prompt = torch.randint(0, vocab, (1, PROMPT), device=device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    aotc.export(model, (prompt,), Path("/tmp/aotc-greedy") / f"mem-{args.model}.aotc",
                decode=True, max_cache_len=CACHE[args.model], target="cuda")
    print(json.dumps({"model": args.model, "aotc": aotc.__file__, "torch": torch.__version__,
                      "dynamo_clone_input": callable(getattr(builder, "clone_input", None)),
                      "export_s": round(time.perf_counter() - t, 1),
                      "weights_gb": round(weights / 1e9, 2),
                      "gpu_beyond_model_gb": round((torch.cuda.max_memory_allocated() - before)
                                                   / 1e9, 2)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("ab", "sampled", "export-memory"))
    ap.add_argument("--model", default="llama-1b", choices=sorted(CACHE))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    export_memory(args) if args.what == "export-memory" else ab(args)


if __name__ == "__main__":
    main()
