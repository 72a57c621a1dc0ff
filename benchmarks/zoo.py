"""The model zoo: export a breadth of real architectures with aotc and check each against eager.

    python -m benchmarks.zoo --out benchmarks/results/cpu-zoo            # every zoo model
    python -m benchmarks.zoo --families transformers --limit-s 120       # one family
    python -m benchmarks.zoo --models vgg11_bn,timm/mobilevitv2_050      # a few ('family/name')
    python -m benchmarks.zoo --size full                                 # published sizes (GPU)

Each model runs in a process of its own (`--worker`), under `--limit-s` seconds of wall time,
so a crash or a hang is that model's result and not the run's. Per model the record says its
status, the error class and message, aotc's export time with its stages, torch.compile's
first-call compile time in the same process (`--no-compile` skips it), and the plan's kernel
and extern counts (`benchmarks/zoo_check.py`). Output in --out: results.json (meta with the
command, the commit and whether the tree was clean; one record per model) and results.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import zoo_report, zoo_sweep
from benchmarks.run import commit
from benchmarks.run import quiet
from benchmarks.zoo_models import ZOO, qualified, zoo_spec

FAMILIES = ("transformers", "torchvision", "timm", *zoo_sweep.FAMILIES)
DEFAULT_FAMILIES = FAMILIES[:3]    # the sweeps (benchmarks/zoo_sweep.py) run when asked


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=("small", "full"), default="small")
    p.add_argument("--models", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="comma-separated model names (default: the whole zoo)")
    p.add_argument("--families", type=lambda s: s.split(","), default=list(DEFAULT_FAMILIES))
    p.add_argument("--limit-s", type=float, default=300.0,
                   help="wall-time limit per model (export, runs and torch.compile)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the torch.compile baseline (pass rates only)")
    p.add_argument("--jobs", type=int, default=1,
                   help="models checked at once (each in its own process); times measured "
                        "beside another job are slower alike for aotc and torch.compile")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads in each worker (default: torch's own default)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/results/cpu-zoo)")
    p.add_argument("--dynamic", action="store_true",
                   help="export with dynamic batch and sequence dims and check other sizes "
                        "too (benchmarks/zoo_dynamic.py)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def chosen(args) -> list:
    if args.models:
        return [zoo_spec(n) for n in args.models]
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    swept = [s for f in zoo_sweep.FAMILIES if f in args.families for s in zoo_sweep.sweep(f)]
    return [s for s in ZOO if s.family in args.families] + swept


def worker(args) -> int:
    """One model in this process: its record written to --record."""
    from benchmarks.zoo_check import check
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = zoo_spec(args.worker)
    with tempfile.TemporaryDirectory(prefix=f"aotc-zoo-{spec.name}-") as tmp:
        rec = check(spec, args.size, Path(tmp), compile_baseline=not args.no_compile,
                    dynamic=args.dynamic)
    args.record.write_text(json.dumps(rec, indent=1, default=str))
    return 0


def run_model(spec, args) -> dict:
    """`spec` checked in a child process under the time limit; a crash or a timeout is a
    record too."""
    with tempfile.TemporaryDirectory(prefix="aotc-zoo-rec-") as tmp:
        record = Path(tmp) / "record.json"
        cmd = [sys.executable, "-m", "benchmarks.zoo", "--worker", qualified(spec),
               "--record", str(record), "--size", args.size]
        cmd += ["--no-compile"] if args.no_compile else []
        cmd += ["--dynamic"] if args.dynamic else []
        cmd += ["--threads", str(args.threads)] if args.threads else []
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.limit_s,
                                  cwd=Path(__file__).resolve().parent.parent)
        except subprocess.TimeoutExpired:
            return {"model": spec.name, "family": spec.family, "size": args.size,
                    "status": "timeout", "error_class": "Timeout",
                    "message": f"over the {args.limit_s:g} s limit per model",
                    "wall_s": round(time.perf_counter() - t0, 1)}
        wall = round(time.perf_counter() - t0, 1)
        if proc.returncode == 0 and record.is_file():
            return dict(json.loads(record.read_text()), wall_s=wall)
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        return {"model": spec.name, "family": spec.family, "size": args.size,
                "status": "crashed", "error_class": f"exit {proc.returncode}",
                "message": tail[-1200:], "wall_s": wall}


def meta(args, argv) -> dict:
    rev, modified = commit()
    import aotc
    libs = {}
    for lib in ("transformers", "torchvision", "timm"):
        try:
            libs[lib] = __import__(lib).__version__
        except ImportError:
            libs[lib] = None
    return {"command": "python -m benchmarks.zoo " + " ".join(argv), "commit": rev,
            "clean_tree": not modified, "modified": modified, "size": args.size,
            "torch": torch.__version__, "aotc": aotc.__version__, **libs,
            "threads": args.threads or torch.get_num_threads(), "cpus": os.cpu_count(),
            "limit_s": args.limit_s, "compile_baseline": not args.no_compile,
            "dynamic": args.dynamic,
            "jobs": args.jobs,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S")}


def main(argv=None) -> int:
    quiet()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    try:
        specs = chosen(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path(__file__).resolve().parent / "results" / "cpu-zoo"
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta(args, argv), "records": []}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for i, rec in enumerate(pool.map(lambda s: run_model(s, args), specs), 1):
            doc["records"].append(rec)
            print(zoo_report.line(i, len(specs), rec), flush=True)
            zoo_report.write(out, doc)    # after every model: a killed run keeps what it did
    print(zoo_report.summary_line(doc["records"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
