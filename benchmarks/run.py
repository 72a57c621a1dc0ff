"""Run the benchmark suite and write results.json, results.md and results.png.

    python -m benchmarks.run --device cpu --suite small --out benchmarks/results/cpu
    python -m benchmarks.run --device cuda --suite full --dtype bf16 --part 2/6 --out DIR
    python -m benchmarks.run --suite smoke --systems eager,aotc          # seconds: a check

`--part K/N` runs every N-th model starting at the K-th, so a long suite can be split into
bounded runs; merge the parts with `python -m benchmarks.report OUT PART_DIR...`. results.json
and results.md are rewritten after every point (results.png at the end), so a run stopped early
keeps what it measured and names the point it stopped in; with `--budget-s`, points that would
start after the budget is spent are recorded as skipped instead.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

from benchmarks import harness, models, report, systems

UNFINISHED = "did not finish: the run was stopped while measuring this point (time limit?)"

# Per device: (warmup, min rounds, max rounds, timing seconds per point, build limit seconds).
TIMING = {"cpu": (3, 10, 100, 2.0, 300.0), "cuda": (10, 20, 200, 3.0, 420.0)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--suite", default="small", choices=tuple(models.SUITES))
    p.add_argument("--dtype", default="fp32", choices=tuple(harness.DTYPES))
    p.add_argument("--models", type=_names, default=None,
                   help="comma-separated model names (default: the suite's)")
    p.add_argument("--systems", type=_names, default=None,
                   help=f"comma-separated, from {', '.join(systems.SYSTEMS)} (default: all "
                        "that run on the device but the aotc:<level> ones; eager always runs)")
    p.add_argument("--points", type=_names, default=list(models.POINTS),
                   help="latency,throughput (default: both)")
    p.add_argument("--part", type=_part, default=(1, 1), help="K/N: run part K of N")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/results/DEVICE-DTYPE-SUITE)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no point after this many seconds (the rest are skipped)")
    p.add_argument("--prebuilt", type=Path, default=None,
                   help="load aotc's artifacts from this folder, which benchmarks/prebuild.py "
                        "fills (at the same time), instead of exporting them here")
    add_timing_args(p)
    return p.parse_args(argv)


def add_timing_args(p: argparse.ArgumentParser) -> None:
    """Threads and the timing protocol's knobs (shared with benchmarks/training.py)."""
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads per op (torch.set_num_threads and OMP_NUM_THREADS, for every "
                        "system alike; default: torch's)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--min-reps", type=int, default=None)
    p.add_argument("--max-reps", type=int, default=None)
    p.add_argument("--timing-s", type=float, default=None,
                   help="seconds of timed rounds per point (all systems together)")
    p.add_argument("--build-limit-s", type=float, default=None,
                   help="per system and point: limit on build + load + first call")


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _part(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N, e.g. 2/5, got {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"part {k}/{n}: need 1 <= K <= N")
    return k, n


def make_config(args, timing: dict = TIMING) -> harness.Config:
    """The harness config: `timing[device]`'s defaults, overridden by the timing arguments."""
    warmup, min_reps, max_reps, timing_s, limit_s = timing[args.device]
    pick = lambda v, default: default if v is None else v   # noqa: E731
    return harness.Config(device=args.device, dtype=args.dtype, warmup=pick(args.warmup, warmup),
                          min_reps=pick(args.min_reps, min_reps),
                          max_reps=pick(args.max_reps, max_reps),
                          timing_s=pick(args.timing_s, timing_s),
                          build_limit_s=pick(args.build_limit_s, limit_s))


def environment(args, cfg: harness.Config, chosen: list, skipped: dict) -> dict:
    """What was run, where, with which versions: the results' `meta`."""
    return {"suite": args.suite, "part": f"{args.part[0]}/{args.part[1]}",
            **machine_meta(args, cfg, chosen), "systems_skipped": skipped}


def commit() -> tuple[str | None, list[str]]:
    """(short commit, tracked files modified in the working tree): what was measured.
    AOTC_COMMIT, where set, names it: a lent GPU machine gets a copy of a clean checkout whose
    .git may be a stale one (it said the session's first commit)."""
    import os
    import subprocess
    if os.environ.get("AOTC_COMMIT"):
        return os.environ["AOTC_COMMIT"], []
    root = Path(__file__).resolve().parent.parent
    git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True,   # noqa: E731
                                    text=True, timeout=10).stdout
    try:
        return git("rev-parse", "--short", "HEAD").strip() or None, \
            git("diff", "--name-only", "HEAD").split()
    except (OSError, subprocess.SubprocessError):
        return None, []


def machine_meta(args, cfg: harness.Config, chosen: list,
                 libs: tuple = ("transformers", "torchvision")) -> dict:
    """The `meta` every benchmark records: device, dtype, systems, config, machine, versions."""
    import aotc
    meta = {"device": args.device, "dtype": args.dtype, "systems": [s.name for s in chosen],
            "config": dataclasses.asdict(cfg),
            "machine": _cpu_name(), "threads": torch.get_num_threads(), "nice": os.nice(0),
            "python": platform.python_version(), "torch": torch.__version__,
            "aotc": aotc.__version__, "matmul_precision": torch.get_float32_matmul_precision(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "load_average_at_start": _load_average(),
            "command": " ".join(["python -m", Path(sys.argv[0]).parent.name + "." +
                                 Path(sys.argv[0]).stem, *sys.argv[1:]]),
            "runner": _aotc_runner()}
    meta["commit"], meta["modified"] = commit()
    for lib in libs:
        try:
            meta[lib] = __import__(lib).__version__
        except ImportError:
            meta[lib] = None
    if args.device == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
    return meta


def _aotc_runner() -> str:
    """The plan runner aotc's CPU artifacts get here (runtime/cpp_runner.py)."""
    from aotc.runtime.cpp_runner import runner_status
    return "cpp" if runner_status()[0] is not None else f"python ({runner_status()[1]})"


def _load_average() -> float | None:
    """The 1-minute load average: other work on the machine skews timings (CPU runs)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def skipped_record(spec, size: str, point: str, why: str) -> dict:
    return {"model": spec.name, "family": spec.family, "point": point, "size": size,
            "batch": spec.batch(size, point), "skipped": why, "systems": {}}


def progress_line(rec: dict, elapsed: float, *, label: str | None = None, ms_digits: int = 3,
                  extra=lambda s: "") -> str:
    """One record as a progress line: eager's median, each system's status and speedup, and
    `extra(system result)` (the training benchmark adds the bytes saved for backward)."""
    label = label or f"{rec['model']} / {rec['point']}"
    head = f"[{elapsed:7.1f}s] {label} (b{rec['batch']})"
    if rec.get("skipped"):
        return f"{head}: skipped ({rec['skipped']})"
    parts = []
    for name, s in rec["systems"].items():
        speed = f" {s['speedup']:.2f}x" if s.get("speedup") and name != "eager" else ""
        ms = (f" {s['median_s'] * 1e3:.{ms_digits}f} ms" if name == "eager" and s.get("median_s")
              else "")
        parts.append(f"{name} {s['status']}{speed}{ms}{extra(s)}")
    return f"{head}: " + " | ".join(parts)


def measure(spec, size: str, point: str, chosen: list, cfg: harness.Config) -> dict:
    """harness.run_point, with a failure of the harness itself (e.g. building the model)
    recorded on the row instead of ending the run."""
    try:
        return harness.run_point(spec, size, point, chosen, cfg)
    except Exception as e:
        harness.release()
        return skipped_record(spec, size, point, f"benchmark error: {harness.describe(e)}")


def run(args) -> dict:
    if args.threads:   # before any system loads an OpenMP library of its own
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    cfg = make_config(args)
    device = torch.device(args.device)
    size, specs = models.select(args.suite, args.models)
    specs = models.split(specs, *args.part)
    chosen, skipped = systems.select(args.systems, device)
    if args.prebuilt is not None:
        chosen = [systems.Aotc(prebuilt=args.prebuilt) if s.name == "aotc" else s
                  for s in chosen]
    out = args.out or Path(__file__).parent / "results" / f"{args.device}-{args.dtype}-{args.suite}"
    meta = environment(args, cfg, chosen, skipped)
    print(f"{len(specs)} models x {len(args.points)} points on {args.device} {args.dtype}: "
          f"{', '.join(s.name for s in chosen)} -> {out}", flush=True)
    start = time.perf_counter()
    systems.warm_up(chosen, device)
    records = []
    for spec in specs:
        why = spec.available()
        for point in args.points:
            elapsed = time.perf_counter() - start
            if why is None and args.budget_s is not None and elapsed > args.budget_s:
                why = f"time budget of {args.budget_s:g} s for this part spent"
            if why:
                records.append(skipped_record(spec, size, point, why))
            else:   # a placeholder first, so a run killed mid-point says where it stopped
                records.append(skipped_record(spec, size, point, UNFINISHED))
                report.write(out, meta, records, plot=False)
                records[-1] = measure(spec, size, point, chosen, cfg)
            print(progress_line(records[-1], time.perf_counter() - start), flush=True)
            meta["wall_s"] = time.perf_counter() - start
            report.write(out, meta, records, plot=False)
    meta["load_average_at_end"] = _load_average()
    doc = report.write(out, meta, records)
    print(f"done in {time.perf_counter() - start:.0f} s: {out}/results.md", flush=True)
    return doc


def quiet() -> None:
    """Keep the console to one line per point: library warnings go nowhere."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def checked_run(args, validate, run) -> int:
    """The shared end of the benchmarks' `main`: exit status 2 with a message for --device
    cuda without a GPU, or for unknown names (`validate(args)` raises ValueError); otherwise
    `run(args)` and 0."""
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but this torch sees no GPU", file=sys.stderr)
        return 2
    try:
        validate(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run(args)
    return 0


def _validate(args) -> None:
    """Unknown model or system names raise ValueError."""
    models.select(args.suite, args.models)
    systems.select(args.systems, torch.device(args.device))


def main(argv=None) -> int:
    quiet()
    return checked_run(parse_args(argv), _validate, run)


if __name__ == "__main__":
    sys.exit(main())
