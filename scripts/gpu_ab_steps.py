"""Same-process A/B of decode steps on a GPU: artifacts exported by several trees (each with
its own codegen) are loaded by one runtime and timed in alternation, so that clock and thermal
drift, and the differences between processes, fall on all of them alike.

    python scripts/gpu_ab_steps.py export OUT.aotc [--model llama-1b]   # with a tree importable
    python scripts/gpu_ab_steps.py time A.aotc B.aotc ... [--rounds 15]

`time` runs rounds of 128 greedy decode steps after a 128-token prompt (plain steps and an
eager argmax; with `--greedy` the module's own greedy loop, the fused step on a GPU), each round
every artifact once (in an order that rotates), and prints each artifact's median step, its
spread, and its ratio to the first artifact's median, with the first token where its greedy
tokens leave the first's. scripts/gpu_ab_steps.sh exports from every tree under .ab/ and this
one.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

PROMPT, STEPS, CACHE = 128, 128, 1216


def _prompt(vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (1, PROMPT), generator=g).cuda()


def export(path: Path, model_name: str) -> None:
    import aotc
    from benchmarks.generate import DTYPES
    from benchmarks.generate_models import build_model
    torch.manual_seed(0)
    model, meta = build_model(model_name, torch.device("cuda"), DTYPES["bf16"])
    t = time.perf_counter()
    aotc.export(model, (_prompt(meta["vocab"]),), path, decode=True, max_cache_len=CACHE,
                target="cuda")
    print(f"exported {path} in {time.perf_counter() - t:.1f} s")


def _run(m, prompt, greedy: bool = False) -> tuple[float, torch.Tensor]:
    """(seconds a step, the greedy tokens) of STEPS decode steps after a prefill: plain decode
    steps and an eager argmax, or with `greedy` the module's own greedy loop."""
    from benchmarks.generate import decode_time, greedy_time
    from benchmarks.generate_systems import Loaded
    system = Loaded()
    system.m = m
    seconds, tokens = (greedy_time if greedy else decode_time)(system, prompt, STEPS)
    return seconds / STEPS, tokens


def time_all(paths: list[Path], rounds: int, vocab: int, greedy: bool = False) -> None:
    import aotc
    mods = [aotc.load(p) for p in paths]
    prompt = _prompt(vocab)
    tokens = [_run(m, prompt, greedy)[1] for m in mods]     # warm: each graph captured
    times: list[list[float]] = [[] for _ in mods]
    for r in range(rounds):
        order = list(range(len(mods)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            times[i].append(_run(mods[i], prompt, greedy)[0])
    base = statistics.median(times[0])
    for p, ts, tok in zip(paths, times, tokens):
        med = statistics.median(ts)
        diff = (tok != tokens[0]).nonzero()
        first = "none" if diff.numel() == 0 else str(int(diff[0, 1]))
        print(f"{p.stem:12s} step {med * 1e6:7.1f} us (min {min(ts) * 1e6:.1f}, max "
              f"{max(ts) * 1e6:.1f}; {len(ts)} rounds)  {med / base:.3f}x the first; tokens "
              f"leave the first's at {first}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("export", "time"))
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--greedy", action="store_true", help="time the module's own greedy loop "
                    "(the fused greedy step on a GPU), not decode steps and an eager argmax")
    args = ap.parse_args()
    if args.what == "export":
        export(args.paths[0], args.model)
    else:
        time_all(args.paths, args.rounds, args.vocab, args.greedy)


if __name__ == "__main__":
    main()
