"""Cold start against weight size: export, load, and load plus first call of BERT-base, a 1.1B and
a 6.7B LLaMA-architecture model, with and without hash verification, beside the machine's own
limits measured in the same run, and torch.compile's and AOTInductor's cold start on the same
models where they build.

    python -m benchmarks.loading --device cpu --models bert,llama-1b --out benchmarks/results/cpu-loading
    python -m benchmarks.loading --device cuda --out benchmarks/results/h200-loading

Every step runs in a process of its own (benchmarks/loading_steps.py), so peak host memory is
that step's and no step warms a cache for another: the model is built (benchmarks/bigmodels.py:
parameters on the meta device, materialised on the device in the model's dtype) and exported;
the artifact's files are read once (a warm page cache, as on a serving host that just copied
it), then loaded verified and unverified, alternating, `--reps` times each (medians); one more
process per variant measures peak memory. The weights phase (reading, hashing, and on a GPU
copying, runtime/loading.load_weights) is timed alone too, and its rate set against the rates
measured by the `limits` step: memcpy, page-cache reads, hashing, host-to-device copies.

Dtypes: on the CPU, BERT in fp32 and the LLaMAs in bf16; on CUDA everything in bf16. Inputs:
one sequence of 32 tokens on the CPU (its first calls stay seconds), 128 on CUDA.
`--steps` picks steps (default: all); records already in OUT/results.json are kept unless
measured again, so a run may be split into several (e.g. one model per call; meta.runs lists
every command that contributed). `--baseline DIR`
(the source tree of another aotc, e.g. `git archive b81f17d | tar -x -C DIR`) runs the export
and load steps with that aotc too, right after this one's, so before and after come from the
same run. Output: results.json (meta with the commit and the command) and results.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

MODELS = ("bert", "llama-1b", "llama-7b")
STEPS = ("export", "load", "memory", "torch.compile", "aotinductor")
ROOT = Path(__file__).resolve().parent.parent


def dtype_of(model: str, device: str) -> torch.dtype:
    return torch.float32 if device == "cpu" and model == "bert" else torch.bfloat16


def run_step(args, step: str, model: str | None = None, baseline: bool = False) -> dict:
    """One step in a fresh process (with the --baseline aotc if `baseline`): its JSON record,
    or {"error": ...}."""
    cmd = [sys.executable, "-m", "benchmarks.loading", "--step", step, "--device", args.device,
           "--work", str(args.work / "baseline" if baseline else args.work),
           "--reps", str(args.reps)] + ([] if args.strict else ["--no-strict"])
    if model:
        cmd += ["--models", model]
    env = dict(os.environ)
    if baseline:   # the other aotc first on the path (an editable install comes after it)
        env["PYTHONPATH"] = os.pathsep.join([str(baseline_root(args)),
                                             env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=args.step_timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr or proc.stdout).strip()[-2000:], "rc": proc.returncode}
    out = json.loads(lines[-1])
    out["wall_s"] = time.perf_counter() - t0
    return out


def baseline_root(args) -> Path:
    """A folder holding `aotc` -> the --baseline tree, for PYTHONPATH."""
    root = args.work / "baseline-src"
    root.mkdir(parents=True, exist_ok=True)
    link = root / "aotc"
    if not link.exists():
        link.symlink_to(args.baseline.resolve())
    return root


def child(args) -> dict:
    """The body of a step's process (see benchmarks/loading_steps.py)."""
    from benchmarks import loading_steps as steps
    device = torch.device(args.device)
    model = args.models
    art = args.work / f"{model}.aotc"
    if args.step == "limits":
        shard = max(args.work.glob("*.aotc/weights*.safetensors"),
                    key=lambda p: p.stat().st_size, default=None)
        return steps.limits(device, shard)
    if args.step == "export":
        return steps.export(model, device, dtype_of(model, args.device), art, args.strict)
    if args.step == "load":
        return steps.load(art, device, args.reps)
    if args.step.startswith("memory"):
        return steps.memory(art, device, args.step == "memory-verified")
    if args.step == "torch.compile":
        return steps.torch_compile(model, device, dtype_of(model, args.device))
    return steps.aotinductor(model, device, dtype_of(model, args.device),
                             args.work / f"{model}.pt2")


def measure(args, results: dict) -> None:
    for model in args.models.split(","):
        rec = results["models"].setdefault(model, {})
        rec["dtype"] = str(dtype_of(model, args.device)).removeprefix("torch.")
        for step in args.steps.split(","):
            print(f"[{time.strftime('%H:%M:%S')}] {model}: {step}", file=sys.stderr, flush=True)
            if step == "memory":
                rec["memory"] = {v: run_step(args, f"memory-{v}", model)
                                 for v in ("verified", "unverified")}
            else:
                rec[step] = run_step(args, step, model)
            if args.baseline is not None and step in ("export", "load"):
                rec.setdefault("baseline", {})[step] = run_step(args, step, model, True)
            save(args, results)
    print(f"[{time.strftime('%H:%M:%S')}] limits", file=sys.stderr, flush=True)
    results["limits"] = run_step(args, "limits")


def meta(args) -> dict:
    from benchmarks.run import commit
    rev, modified = commit()
    rev, modified = (args.commit, []) if args.commit else (rev, modified)
    return {"benchmark": "loading", "device": args.device, "commit": rev, "modified": modified,
            "baseline": _baseline_version(args), "strict": args.strict,
            "command": "python -m benchmarks.loading " + " ".join(
                shlex.quote(a) for a in sys.argv[1:]),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_average": os.getloadavg()[0]}


def _baseline_version(args) -> str | None:
    if args.baseline is None:
        return None
    # the package's format module: artifact/format.py since the contract package, before it
    # runtime/format.py
    version = next((p for p in (args.baseline / "artifact" / "format.py",
                                args.baseline / "runtime" / "format.py") if p.exists()),
                   args.baseline / "artifact" / "format.py")
    line = next((x for x in version.read_text().splitlines()
                 if x.startswith("FORMAT_VERSION")), "")
    return f"{args.baseline} ({line.strip()})"


def save(args, results: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    from benchmarks.loading_report import markdown
    (args.out / "results.md").write_text(markdown(results))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", default=",".join(STEPS))
    p.add_argument("--reps", type=int, default=5, help="loads per variant (medians)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--work", type=Path, default=Path("/tmp/aotc-loading"),
                   help="where artifacts are written (needs the weights' size twice)")
    p.add_argument("--step-timeout", type=float, default=3600)
    p.add_argument("--no-strict", dest="strict", action="store_false",
                   help="export with strict=False (torch.export's strict capture holds about "
                        "two more copies of the weights for a moment)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="source tree of another aotc to measure export and load with too")
    p.add_argument("--commit", default=None, help="the commit measured, if not a git checkout")
    p.add_argument("--step", default=None, help=argparse.SUPPRESS)   # a step's own process
    args = p.parse_args(argv)
    args.out = args.out or ROOT / "benchmarks" / "results" / f"{args.device}-loading"
    return args


def main(argv=None) -> None:
    args = parse(argv)
    if args.step is not None:
        print(json.dumps(child(args)), flush=True)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {"models": {}}
    runs = results.get("meta", {}).get("runs", [])
    before = results.get("meta", {}).get("baseline")
    results["meta"] = meta(args)
    if results["meta"]["baseline"] is None:    # a run without one keeps an earlier run's
        results["meta"]["baseline"] = before
    results["meta"]["runs"] = runs + [{k: results["meta"][k] for k in
                                       ("command", "commit", "modified", "started")}]
    measure(args, results)
    save(args, results)
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
