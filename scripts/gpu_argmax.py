"""argmax over long rows on a GPU: aotc's two-stage kernels (codegen/lowering/split_arg.py)
against its one-stage kernel and eager torch.argmax, timed in one process, alternating.

    python3 scripts/gpu_argmax.py [--shapes 1x32000,8x32000,1x50257,1x151936] [--rounds 15]

Each shape is exported twice by this tree (the one-stage artifact with the split turned off),
bf16, for this machine's GPU, as a model of 16 argmaxes (of the row scaled by powers of two,
exactly: 16 kernels or kernel pairs a call, so that the GPU's time, not a call's fixed cost,
is what is timed);
both are checked against eager on random rows, on rows of ties and on rows with NaN, then
each round times 100 calls of each (CUDA-graph replays) and of the eager model. Prints one
line per shape: medians in microseconds per argmax.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

import aotc
from aotc.codegen.lowering import split_arg


REPEATS = 16


class ArgMax(torch.nn.Module):
    def forward(self, logits):
        return torch.stack([torch.argmax(logits * 2.0 ** (i % 8 - 4), -1) for i in range(REPEATS)])


def export(shape, folder: Path, split: bool):
    plan = split_arg.plan_chunks
    if not split:
        split_arg.plan_chunks = lambda rows, n: None
    try:
        x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
        name = f"{'x'.join(map(str, shape))}_{'split' if split else 'one'}.aotc"
        return aotc.load(aotc.export(ArgMax(), (x,), folder / name, target="cuda"))
    finally:
        split_arg.plan_chunks = plan


def check(fn, shape) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    for kind in ("random", "ties", "nan"):
        x = torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)
        if kind != "random":
            x = torch.randint(-3, 4, shape, generator=g, device="cuda").to(torch.bfloat16)
        if kind == "nan":
            x.view(-1)[::997] = float("nan")
        assert torch.equal(fn(x), ArgMax()(x)), (shape, kind)


def time_us(fn, x, calls: int = 100) -> float:
    for _ in range(3):
        fn(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn(x)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / calls / REPEATS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x32000,8x32000,1x50257,1x151936")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for text in args.shapes.split(","):
            shape = tuple(int(s) for s in text.split("x"))
            systems = {"torch": ArgMax(),
                       "aotc one stage": export(shape, Path(tmp), False),
                       "aotc split": export(shape, Path(tmp), True)}
            for fn in systems.values():
                check(fn, shape)
            x = torch.randn(shape, device="cuda").to(torch.bfloat16)
            times = {k: [] for k in systems}
            for _ in range(args.rounds):
                for k, fn in systems.items():
                    times[k].append(time_us(fn, x))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{text:>9}: " + ", ".join(f"{k} {v:.1f} us" for k, v in med.items())
                  + f"; split/one {med['aotc split'] / med['aotc one stage']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
