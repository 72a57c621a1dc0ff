"""Per-call cost of aotc's plan runners, against eager's cost of dispatching one op.

    python -m benchmarks.overhead --threads 1 --out benchmarks/results/cpu-overhead

An artifact whose plan is a single pointwise kernel over 8 floats (`x * 2 + 1`, fused) does
almost no work, so its call time is the runtime's own cost: guards, the plan runner, the
kernel call. The same artifact is loaded twice, with the C++ runner and with the Python one,
and timed with eager's single op (`torch.mul(x, 2)`: ATen's dispatch from Python) and eager's
two-op model, all interleaved in one process: each round times a block of calls of every
variant in turn, and the medians over rounds are reported, so load from other processes
shifts every variant alike. "plan" variants call the entry's plan function alone (no guards),
"call" variants what a user calls (`m(x)`: guards, plan, output structure).

`--device cuda` times the same on a GPU (a CUDA artifact; both runners launch its cubin, CUDA
graphs off, each block of calls ends with a synchronize), plus the default call that replays a
CUDA graph.

Output in --out: results.json (meta with versions, the commit and the command; the median
us per call of every variant) and results.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


class Pointwise(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


def variants(path: Path, x: torch.Tensor) -> dict:
    """name -> a no-argument callable, one per thing timed."""
    import aotc
    dev = x.device   # on a GPU: the runners launching, CUDA graphs off (that is the host cost)
    cpp, py = (aotc.load(path, device=dev, runner=r, cuda_graph=False if dev.type == "cuda"
                         else None) for r in ("cpp", "python"))
    if cpp.runtime != "cpp":
        raise SystemExit(f"the C++ runner is not in use: {cpp.runtime}")
    fc, fp = cpp.entries["forward"].function, py.entries["forward"].function
    model, args = Pointwise(), (x,)
    out = {"eager op (torch.mul)": lambda: torch.mul(x, 2),
           "eager model (2 ops)": lambda: model(x),
           "aotc plan, C++ runner": lambda: fc(args, {}),
           "aotc plan, Python runner": lambda: fp(args, {}),
           "aotc call, C++ runner": lambda: cpp(x),
           "aotc call, Python runner": lambda: py(x)}
    if dev.type == "cuda":
        graphed = aotc.load(path, device=dev)
        out["aotc call, CUDA graph"] = lambda: graphed(x)
    return out


def measure(calls: dict, rounds: int, block: int) -> dict:
    """Median us per call of each variant over `rounds` interleaved blocks of `block` calls
    (on a GPU each block ends with a synchronize, so queued launches are paid for)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    with torch.no_grad():
        for fn in calls.values():      # warm-up
            for _ in range(block):
                fn()
        for _ in range(rounds):
            for name, fn in calls.items():
                sync()
                t0 = time.perf_counter()
                for _ in range(block):
                    fn()
                sync()
                times[name].append((time.perf_counter() - t0) / block * 1e6)
    return {name: round(statistics.median(ts), 3) for name, ts in times.items()}


def report(result: dict) -> str:
    m = result["us_per_call"]
    eager = m["eager op (torch.mul)"]
    lines = ["| variant | us per call | x eager op |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.2f} | {v / eager:.2f} |" for k, v in m.items()]
    meta = result["meta"]
    return "\n".join([f"# Runner overhead ({meta.get('device', 'cpu')}, {meta['threads']} "
                      f"thread(s), torch {meta['torch']}, "
                      f"commit {meta['commit']})", "", f"`{meta['command']}`", "", *lines, ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--block", type=int, default=2000)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu-overhead"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import aotc
    from benchmarks.run import commit
    x = torch.randn(8, device=args.device)
    with tempfile.TemporaryDirectory() as tmp:
        path = aotc.export(Pointwise(), (x,), Path(tmp) / "pointwise.aotc", target=args.device)
        plan_steps = len(aotc.load(path, device=args.device).entries["forward"].plan.steps)
        us = measure(variants(path, x), args.rounds, args.block)
    rev, modified = commit()
    result = {"meta": {"benchmark": "runner overhead", "device": args.device,
                       "threads": torch.get_num_threads(),
                       "torch": torch.__version__, "commit": rev, "modified": modified,
                       "command": " ".join(["python -m benchmarks.overhead", *sys.argv[1:]]),
                       "plan_steps": plan_steps, "rounds": args.rounds, "block": args.block},
              "us_per_call": us}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
