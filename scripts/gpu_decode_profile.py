"""Where a decode step's (or, with --phase prefill, a prefill's) time goes on a GPU: aotc's
graph against torch.compile (reduce-overhead) of the same static-cache step, kernel by kernel
(torch.profiler).

    python scripts/gpu_decode_profile.py --model llama-1b --out OUT

Prints, per system, the step's wall time, the GPU time its kernels take, the kernel count, and
the kernels grouped by name (total time, count), longest first; with --sequence, kernels in
launch order; with --configs, each aotc kernel's grid, blocks and warps (and, with --autotune,
the tuned artifact's isolated times of the heuristic and the chosen config).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.generate import DTYPES, decode_time, prefill_time
from benchmarks.generate_models import build_model
from benchmarks.generate_systems import Aotc, Compiled


def profile(system, prompt, steps: int, phase: str = "decode") -> dict:
    for _ in range(3 if phase == "prefill" else 1):   # warm: graphs captured (prefill's
        if phase == "prefill":                          # after its second call)
            system.reset()
            system.prefill(prompt)
        else:
            decode_time(system, prompt, 8)
    system.reset()
    logits = system.prefill(prompt)
    token = logits.argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            if phase == "prefill":
                system.reset()
                token = system.prefill(prompt)
            else:
                token = system.decode(token).argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / steps
    kernels = defaultdict(lambda: [0.0, 0])
    timeline = sorted((e.time_range.start, e.time_range.end, e.name[:90]) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name[:90]]
            k[0] += e.device_time_total / steps
            k[1] += 1
    total = sum(v[0] for v in kernels.values())
    count = sum(v[1] for v in kernels.values()) / steps
    return {"wall_us": wall * 1e6, "gpu_us": total, "kernels": count, "timeline": timeline,
            "by_name": sorted(((n, t, c / steps) for n, (t, c) in kernels.items()),
                              key=lambda x: -x[1])}


def kernel_labels(path: Path, entry: str = "decode") -> dict[str, str]:
    """{kernel name: the ops it fuses} of an artifact's plan (what `aotc inspect --fusion`
    prints), so a profile's kernels read as what they compute."""
    from aotc.artifact.reader import Artifact
    from aotc.artifact.schema.types import StepKind
    labels = {}
    for step in Artifact(path).plan(entry).steps:
        if step.kind is StepKind.KERNEL:
            ops = [op.split(".")[0] for f in step.fused for op in f.get("ops", [])]
            labels[step.name] = "+".join(dict.fromkeys(ops))[:80]
    return labels


def kernel_configs(path: Path, labels: dict) -> list[str]:
    """One line per kernel of the profiled entry: its grid, constexpr blocks and warps, and,
    in an autotuned artifact, the heuristic's time against the chosen config's."""
    import json
    lines = []
    for name, fused in labels.items():
        spec = json.loads((path / "kernels" / f"{name}.json").read_text())
        at = spec.get("autotune") or {}
        tuned = (f"  tuned {at['heuristic_us']:.1f} -> {at['chosen_us']:.1f} us "
                 f"{at['chosen']}" if "heuristic_us" in at else "")
        lines.append(f"  {name:18s} grid {'x'.join(spec['grid'])} {spec['constexprs']} "
                     f"w{spec['num_warps']}{tuned}  [{fused[:50]}]")
    return lines


def grouped(by_name, labels: dict) -> list[str]:
    """Kernel time summed by what the kernels fuse (one line per kind, longest first)."""
    kinds = defaultdict(lambda: [0.0, 0])
    for n, t, c in by_name:
        k = kinds[labels.get(n.split("(")[0].strip(), n[:60])]
        k[0] += t
        k[1] += c
    return [f"  {t:8.1f} us  x{c:4.0f}  {n}" for n, (t, c) in
            sorted(kinds.items(), key=lambda kv: -kv[1][0])[:30]]


def sequence(timeline, labels: dict, first: int, count: int) -> list[str]:
    """Kernels `first` .. `first + count` of the profiled run in launch order: start (us after
    the first shown), duration, the idle gap before it, name and what it fuses."""
    shown = timeline[first:first + count]
    if not shown:
        return []
    t0, prev, lines = shown[0][0], shown[0][0], []
    for start, end, name in shown:
        short = name.split("(")[0].strip()
        lines.append(f"  {start - t0:8.1f} {end - start:6.1f} us  gap {start - prev:5.1f}  "
                     f"{short[:40]}  [{labels.get(short, '')}]")
        prev = end
    return lines


def report(name: str, system, prompt, args, tmp: Path) -> list[str]:
    """One system's lines: the clean time, the profile by kind, and the kernels asked for."""
    clean = sorted(prefill_time(system, prompt) if args.phase == "prefill" else
                   decode_time(system, prompt, 128)[0] / 128 for _ in range(3))[1]
    r = profile(system, prompt, args.steps, args.phase)
    lines = [f"== {name}: step {clean * 1e6:.0f} us ({args.batch / clean:.0f} tokens/s) "
             f"unprofiled; {r['wall_us']:.0f} us wall profiled, {r['gpu_us']:.0f} us in "
             f"{r['kernels']:.0f} kernels"]
    labels = {}
    if name.startswith("aotc"):
        labels = kernel_labels(tmp / ("g.aotc" if name == "aotc" else "t.aotc"), args.phase)
        lines.append("  by what the kernels fuse:")
        lines += grouped(r["by_name"], labels)
        lines.append("  longest kernels:")
        lines += [f"  {t:8.1f} us  x{c:4.0f}  {n}  [{labels.get(n, '')}]"
                  for n, t, c in r["by_name"][:40]]
    else:
        lines += [f"  {t:8.1f} us  x{c:4.0f}  {n}" for n, t, c in r["by_name"][:25]]
    if labels and args.configs:
        lines.append("  kernel configs:")
        lines += kernel_configs(tmp / ("g.aotc" if name == "aotc" else "t.aotc"), labels)
    if args.sequence:
        first, count = (int(v) for v in args.sequence.split(":"))
        lines.append(f"  kernels {first}..{first + count} in launch order:")
        lines += sequence(r["timeline"], labels, first, count)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--cache", type=int, default=1216)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--autotune", action="store_true", help="export aotc's artifact with it")
    ap.add_argument("--quantize", default=None, help="export aotc's artifact with --quantize")
    ap.add_argument("--generic", default="",
                    help="an A/B: decode products over these schemes (comma list of int4, "
                         "fp8, int8) lowered by the generic fused one-row products (reading "
                         "the stored weight through its lazy dequantizing body) instead of the "
                         "quantized-weight kernel")
    ap.add_argument("--kernel-int8", action="store_true",
                    help="the other side of that A/B for int8, which the generic products "
                         "take by default: its products by the quantized-weight kernel")
    ap.add_argument("--systems", default="aotc,reduce-overhead",
                    help="comma list of aotc, reduce-overhead")
    ap.add_argument("--phase", default="decode", choices=("decode", "prefill"),
                    help="profile decode steps, or whole prefills of --prompt tokens")
    ap.add_argument("--sequence", default="",
                    help="FIRST:COUNT, print those kernels of the profiled run in launch order")
    ap.add_argument("--configs", action="store_true",
                    help="print each aotc kernel's grid, blocks, warps (and autotune timings)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.generic:
        from aotc.codegen.lowering import quantized
        chosen, generic = quantized.quant_weight, set(args.generic.split(","))
        quantized.quant_weight = lambda g, w: (None if (q := chosen(g, w)) is None or
                                               q.scheme in generic else q)
    if args.kernel_int8:
        from aotc.codegen.lowering import quantized
        quantized._fused_int8 = lambda *_: False
    device = torch.device("cuda")
    model, meta = build_model(args.model, device, DTYPES[args.dtype])
    prompt = torch.randint(0, meta["vocab"], (args.batch, args.prompt), device=device)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        chosen = args.systems.split(",")
        systems = {}
        if "aotc" in chosen:
            systems["aotc"] = Aotc(model, args.batch, args.cache, prompt, Path(tmp) / "g.aotc",
                                   **({"quantize": args.quantize} if args.quantize else {}))
        if args.autotune:
            systems["aotc-autotune"] = Aotc(model, args.batch, args.cache, prompt,
                                            Path(tmp) / "t.aotc",
                                            autotune=True)
        if "reduce-overhead" in chosen:
            systems["reduce-overhead"] = Compiled(model, args.batch, args.cache)
        for name, s in systems.items():
            part = report(name, s, prompt, args, Path(tmp))
            print("\n".join(part), flush=True)
            lines += part
    text = "\n".join(lines)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode_profile.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
