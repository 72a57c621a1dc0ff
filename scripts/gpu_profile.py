"""Where a benchmark point's GPU time goes, and what `--autotune` buys, on a CUDA machine.

    python scripts/gpu_profile.py vit:throughput distilbert:throughput [--dtype bf16]
                                  [--autotune] [--dynamic] [--compiled] [--top 12]

For each MODEL:POINT of the benchmark registry (full size): the model is exported with aotc
and loaded without a CUDA graph (so every kernel's time is attributed), then eager and aotc
run under torch.profiler and the top CUDA kernels of each are printed with the total kernel
time per call. With --autotune the model is also exported with autotune=True and both
artifacts are timed with their CUDA graphs (median of interleaved rounds after warm-up), with
the autotune summary from the manifest. With --compiled, torch.compile's kernels too (default
mode: the kernels reduce-overhead replays in its CUDA graph). With --dynamic the model is also exported with the
dynamic dims of `benchmarks.dynamic` (batch, and seq for sequence models), and its kernel table
(labelled by what each kernel computes, as the static one) and both artifacts' times with CUDA
graphs are printed: where a dynamic artifact loses time against a static one. Run from the
repository root (`aotc` importable).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aotc  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks.harness import DTYPES, cast  # noqa: E402


def kernel_table(fn, iters: int, top: int, rename=None) -> str:
    """The top CUDA kernels of `fn` by total time per call; `rename(name)` groups kernels under
    a label of their own (aotc's numbered kernels by what they compute)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else \
        "self_cuda_time_total"
    groups: dict = {}
    for e in events:
        key = rename(e.key) if rename else e.key
        t, n = groups.get(key, (0.0, 0))
        groups[key] = (t + getattr(e, attr), n + e.count)
    rows = sorted(groups.items(), key=lambda kv: kv[1][0], reverse=True)
    total = sum(t for t, _ in groups.values()) / iters
    lines = [f"  kernel time per call {total / 1000:.3f} ms over {len(events)} kernel names"]
    for key, (t, n) in rows[:top]:
        t /= iters
        lines.append(f"  {t / 1000:8.3f} ms {100 * t / total:5.1f}%  x{n // iters:<4d} "
                     f"{key[:110]}")
    return "\n".join(lines)


def aotc_labels(path) -> dict:
    """aotc kernel name -> 'entry: ops | ops (rows)' from the artifact's plans."""
    labels = {}
    for plan_file in (Path(path) / "plans").glob("*.json"):
        plan = json.loads(plan_file.read_text())
        for step in plan["steps"]:
            if step["kind"] == "kernel":
                ops = "|".join("+".join(dict.fromkeys(f["ops"])) for f in step["fused"])
                rows = step["reasons"][0].rsplit("rows ", 1)[-1] if step["reasons"] else ""
                labels[step["name"]] = f"{plan['entry']}: {ops[:70]} rows {rows}"
    return labels


def median_ms(calls: dict, rounds: int = 30, inner: int = 10) -> dict:
    for fn in calls.values():
        for _ in range(5):
            fn()
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) / inner * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("points", nargs="+", help="MODEL:POINT, e.g. vit:throughput")
    p.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))
    p.add_argument("--autotune", action="store_true")
    p.add_argument("--dynamic", action="store_true",
                   help="also profile an artifact with dynamic dims against the static one")
    p.add_argument("--compiled", action="store_true",
                   help="also torch.compile's kernels (the ones reduce-overhead replays)")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args(argv)
    device, dtype = torch.device("cuda"), DTYPES[args.dtype]
    status = 0
    for item in args.points:
        try:
            profile_point(item, args, device, dtype)
        except Exception:   # report and go on: one session's GPU time covers every point
            traceback.print_exc()
            status = 1
        torch.cuda.empty_cache()
    return status


def profile_point(item: str, args, device, dtype) -> None:
    """Kernel tables of eager and aotc for one MODEL:POINT; with --autotune, timings too."""
    by_name = {s.name: s for s in models.REGISTRY}
    name, _, point = item.partition(":")
    spec = by_name[name]
    model, inputs = spec.make("full", point or "throughput")
    model, inputs = model.to(device=device, dtype=dtype), cast(inputs, device, dtype)
    print(f"== {name} {point} batch {spec.batch('full', point)} {args.dtype}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        path = aotc.export(model, inputs, Path(tmp) / "m.aotc", target="cuda")
        plain = aotc.load(path, device=device, cuda_graph=False)
        print("eager:\n" + kernel_table(lambda: model(*inputs), args.iters, args.top))
        labels = aotc_labels(path)
        print("aotc (no graph):\n" + kernel_table(lambda: plain(*inputs), args.iters, args.top,
                                                  lambda k: labels.get(k, k)), flush=True)
        if args.compiled:
            compiled = torch.compile(model)
            print("torch.compile:\n" + kernel_table(lambda: compiled(*inputs), args.iters,
                                                     args.top), flush=True)
        if args.dynamic:
            compare_dynamic(spec, model, inputs, path, Path(tmp), args)
        if args.autotune:
            t0 = time.perf_counter()
            tuned_path = aotc.export(model, inputs, Path(tmp) / "t.aotc", target="cuda",
                                     autotune=True)
            export_s = time.perf_counter() - t0
            manifest = json.loads((tuned_path / "manifest.json").read_text())
            summary = manifest["target"].get("native", {}).get("autotune")
            print(f"autotune export {export_s:.1f} s: {json.dumps(summary)}")
            graphed = aotc.load(path, device=device)
            tuned = aotc.load(tuned_path, device=device)
            ms = median_ms({"eager": lambda: model(*inputs),
                            "aotc": lambda: graphed(*inputs),
                            "aotc autotune": lambda: tuned(*inputs)})
            print("  ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)



def compare_dynamic(spec, model, inputs, static_path, tmp: Path, args) -> None:
    """The kernel table of the model exported with dynamic dims (at the same example sizes),
    and the static and dynamic artifacts timed with their CUDA graphs."""
    from benchmarks.dynamic import export_dynamic
    dyn = export_dynamic(spec, "full", model, inputs, "cuda", tmp)
    if "error" in dyn:
        print(f"dynamic export failed: {dyn['error']}")
        return
    plain = aotc.load(dyn["path"], cuda_graph=False)
    labels = aotc_labels(dyn["path"])
    print("aotc dynamic (no graph):\n" + kernel_table(lambda: plain(*inputs), args.iters,
                                                      args.top, lambda k: labels.get(k, k)))
    static, dynamic = aotc.load(static_path), aotc.load(dyn["path"])
    ms = median_ms({"eager": lambda: model(*inputs), "static": lambda: static(*inputs),
                    "dynamic": lambda: dynamic(*inputs)})
    print("  ".join(f"{k} {v:.3f} ms" for k, v in ms.items()) +
          f"  (graphs: {static.graph_status()['forward']} / {dynamic.graph_status()['forward']})",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
