"""Where a training step's time goes on a CUDA machine: eager vs torch.compile vs aotc.

    python scripts/gpu_train_profile.py bert gpt2 [--dtype bf16] [--top 15] [--systems ...]

For each model of benchmarks/training.py (full size, throughput batch, train mode) every system
is built as the training benchmark builds it, then per system:
  - the step's wall time (median of synchronized steps after warm-up), the host time of a step
    that is not waited for (how long the Python side takes to issue it: when it is close to the
    wall time, the step is host-bound), and the kernel time per step from torch.profiler;
  - the top CUDA kernels of the step by total time (count per step, share).
Run from the repository root (`aotc` importable).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, models, training_step  # noqa: E402
from scripts.gpu_profile import aotc_labels, kernel_table  # noqa: E402


def wall_and_host_ms(step, rounds: int = 30) -> tuple[float, float]:
    for _ in range(5):
        step()
    walls, hosts = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hosts.append((t1 - t0) * 1000)
        walls.append((t2 - t0) * 1000)
    return statistics.median(walls), statistics.median(hosts)


def host_table(step, top: int, steps: int = 20) -> str:
    """Where the host's time goes in `steps` steps: cProfile's functions by own time."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    lines = [ln for ln in text.getvalue().splitlines() if ln.strip()][-top - 1:]
    return f"  host profile over {steps} steps (tottime, cumtime in s):\n" + "\n".join(
        "    " + ln[:150] for ln in lines)


def profile_model(name: str, args, device, dtype) -> None:
    spec = {s.name: s for s in models.REGISTRY}[name]
    model, inputs = spec.make("full", "throughput")
    model = model.to(device=device, dtype=dtype).train()
    inputs = harness.cast(inputs, device, dtype)
    print(f"== {name} batch {spec.batch('full', 'throughput')} {args.dtype}", flush=True)
    weights = None
    with tempfile.TemporaryDirectory() as tmp, training_step.eager_rng_in_inductor():
        for sys_name in ["eager"] + [s for s in args.systems.split(",") if s != "eager"]:
            system = training_step.TRAIN_SYSTEMS[sys_name]
            t0 = time.perf_counter()
            trainee = system.build(model, inputs, Path(tmp) / sys_name.replace(".", "_"))
            if weights is None:
                with torch.no_grad():
                    weights = training_step.projection_weights(trainee.forward())
            step = training_step.make_step(trainee, weights)
            step()
            torch.cuda.synchronize()
            build = time.perf_counter() - t0
            wall, host = wall_and_host_ms(step)
            print(f"-- {sys_name}: build+first step {build:.1f} s; step wall {wall:.3f} ms, "
                  f"host issue {host:.3f} ms", flush=True)
            rename = None
            if sys_name.startswith("aotc"):
                labels = aotc_labels(trainee.module.path)
                rename = lambda k: labels.get(k, k)   # noqa: E731
            print(kernel_table(step, args.iters, args.top, rename), flush=True)
            if hasattr(trainee.module, "graph_status"):
                print(f"  graphs: {trainee.module.graph_status()}", flush=True)
            if args.host_profile and sys_name != "torch.compile":
                print(host_table(step, args.top), flush=True)
            del trainee, step
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--dtype", default="bf16", choices=tuple(harness.DTYPES))
    p.add_argument("--systems", default="eager,torch.compile,aotc:no-graph,aotc")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--host-profile", action="store_true",
                   help="also cProfile the host side of eager's and aotc's steps")
    args = p.parse_args(argv)
    device, dtype = torch.device("cuda"), harness.DTYPES[args.dtype]
    status = 0
    for name in args.models:
        try:
            profile_model(name, args, device, dtype)
        except Exception:
            traceback.print_exc()
            status = 1
        torch.cuda.empty_cache()
    return status


if __name__ == "__main__":
    sys.exit(main())
