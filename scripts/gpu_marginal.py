"""What each kind of kernel costs inside a decode step on a GPU, measured in place: the step's
time with every kernel of one kind launched twice (and, separately, not at all) against the
plain step, in the same process, interleaved, each variant replayed as its own CUDA graph.

    python scripts/gpu_marginal.py --model llama-1b --out OUT

A profiler's per-kernel times do not say this: with programmatic dependent launch a kernel
starts while its predecessor runs and its measured span includes the wait, and removing a
kernel also removes its boundary (the drain of one grid and the ramp of the next). Launching a
kind twice adds one more such kernel after each; dropping it removes the kernel and its
boundary (the step's values are then wrong, its time is what matters). A kind is the kernels
of one grid and block configuration (every layer's RMSNorm, its q/k/v product, ...).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

import aotc
from benchmarks.generate import DTYPES
from benchmarks.generate_models import build_model
from aotc.artifact.schema.types import StepKind


def kinds(plan, path: Path) -> dict[str, list[int]]:
    """{kind: the kernel steps of that kind}, a kind named by its grid and blocks."""
    out = defaultdict(list)
    for idx, step in enumerate(plan.steps):
        if step.kind is not StepKind.KERNEL:
            continue
        spec = json.loads((path / "kernels" / f"{step.name}.json").read_text())
        out[f"grid {'x'.join(spec['grid'])} {spec['constexprs'] or 'hand-written'}"].append(idx)
    return out


def variant(fn, steps: set[int], mode: str):
    """The plan function's source with the launch line of each step in `steps` doubled
    ("twice") or removed ("drop"), compiled in the same namespace."""
    src = fn.source.split("\n# run once, at load")[0].split("\n")
    last = {}
    for line_no, idx in fn.line_steps.items():   # 1-based lines of each step's body
        if idx in steps:
            last[idx] = max(last.get(idx, 0), line_no)
    launch = {n - 1 for n in last.values()}
    out = []
    for i, line in enumerate(src):
        if i not in launch:
            out.append(line)
            continue
        assert re.match(r"\s+k\d+\(", line), line
        out += [line, line] if mode == "twice" else []
    ns = fn.namespace
    exec(compile("\n".join(out) + "\n", "<variant>", "exec"), ns)  # noqa: S102
    return ns[[k for k in ns if k.startswith("plan_")][0]]


def step_us(m, prompt, steps: int) -> float:
    """Microseconds a greedy decode step takes (the argmax fed back), after a prefill."""
    m.reset()
    tok = m.prefill(prompt).argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        tok = m.decode(tok).argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e6


def bare_us(m, prompt, steps: int) -> float:
    """The same without the argmax: one token fed to every step (what the runtime's own
    graph costs, without the host-side feedback)."""
    m.reset()
    tok = m.prefill(prompt).argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        m.decode(tok)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--cache", type=int, default=1216)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = torch.device("cuda")
    model, meta = build_model(args.model, device, DTYPES[args.dtype])
    prompt = torch.randint(0, meta["vocab"], (1, args.prompt), device=device)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.aotc"
        aotc.export(model, (prompt,), path, decode=True, max_cache_len=args.cache,
                    target="cuda")
        m = aotc.load(path, runner="python")
        entry = m.entries[m.generation.decode]
        fn, plain = entry.function, entry.function.fn
        groups = {k: v for k, v in kinds(entry.plan, path).items() if len(v) >= 4}
        variants = {"plain": plain}
        for name, idx in groups.items():
            for mode in ("twice", "drop"):
                variants[f"{mode:5s} {len(idx):3d} x {name}"] = variant(fn, set(idx), mode)
        times = defaultdict(list)
        checked, flag_read = fn.check_flag, fn.namespace["check_error_flag"]
        for _ in range(args.repeats):
            # the variants' index flags are not read after each step (a dropped kernel leaves
            # garbage indices); "plain, checked" is the default: read, a sync each step
            fn.check_flag = fn.namespace["check_error_flag"] = lambda *a, **k: None
            for name, f in variants.items():
                fn.fn = f
                m.graphs = m._graphs(None, 8)
                step_us(m, prompt, 8)                 # captures this variant's graph
                times[name].append(step_us(m, prompt, args.steps))
            fn.fn = plain
            m.graphs = m._graphs(None, 8)
            step_us(m, prompt, 8)
            times["plain, no argmax"].append(bare_us(m, prompt, args.steps))
            fn.check_flag, fn.namespace["check_error_flag"] = checked, flag_read
            step_us(m, prompt, 8)
            times["plain, checked"].append(step_us(m, prompt, args.steps))
        base = statistics.median(times["plain"])
        lines.append(f"{args.model} {args.dtype} batch 1 cache {args.cache} prompt "
                     f"{args.prompt}: plain step {base:.1f} us (median of {args.repeats})")
        for name, t in times.items():
            med = statistics.median(t)
            n = int(name.split()[1]) if name.split()[0] in ("twice", "drop") else 0
            per = f"{(med - base) / n:+6.2f} us a kernel" if n else ""
            lines.append(f"  {med:8.1f} us  {med - base:+7.1f}  {per}  {name}")
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "marginal.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
