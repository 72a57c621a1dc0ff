"""Decoding through each runtime on a GPU, in one process and one artifact: the Python front end
(aotc.load) with the Python runner and with the C++ runner, and the C++ front end (tests/cpp's
`generate`, no Python) with CUDA graphs and without; greedy tokens compared across all four.

    python scripts/gpu_cpp_decode.py --model llama-1b --out OUT

Prints, per system, the mean time of a decode step (steps after the first, which captures
the graph; median of `--repeats` runs of `--steps` steps at prompt `--prompt`) and writes
OUT/results.json. Needs the C++ runtime built in place (scripts/gpu_cpp.sh) and cmake.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def next_token(logits: torch.Tensor, batch: int) -> torch.Tensor:
    return logits.reshape(batch, -1, logits.shape[-1])[:, -1].argmax(-1, keepdim=True)


def python_run(path: Path, runner: str, ids, steps: int) -> tuple[float, torch.Tensor]:
    """(us a decode step after the first, the tokens) through aotc.load."""
    import aotc
    m = aotc.load(path, runner=runner)
    b = ids.shape[0]
    tokens = [next_token(m.prefill(ids), b)]
    tokens.append(next_token(m.decode(tokens[-1]), b))   # captures the graph
    sync(ids.device)
    t = time.perf_counter()
    for _ in range(steps):
        tokens.append(next_token(m.decode(tokens[-1]), b))
    sync(ids.device)
    return (time.perf_counter() - t) / steps * 1e6, torch.cat(tokens, 1).cpu()


def cpp_run(build: Path, path: Path, ids_file: Path, steps: int, graphs: bool):
    """(us a decode step after the first, the tokens, graph status lines) through C++."""
    from conftest import run_generate
    done, tokens = run_generate(build, path, ids_file, steps + 2,
                                [] if graphs else ["--no-cuda-graph"])
    if done.returncode != 0:
        raise SystemExit(f"generate failed: {done.stderr[-2000:]}")
    us = float(next(l.split()[1] for l in done.stderr.splitlines()
                    if l.startswith("decode_us_per_step")))
    return us, tokens, [l for l in done.stderr.splitlines() if l.startswith("graph ")]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    import aotc
    from safetensors.torch import save_file
    from benchmarks.generate_models import build_model
    from benchmarks.run import commit
    from conftest import cmake_build
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    model, meta = build_model(args.model, device, torch.bfloat16 if device.type == "cuda"
                              else torch.float32)
    ids = torch.randint(0, meta["vocab"], (1, args.prompt), generator=torch.Generator().manual_seed(0))
    cache = (args.prompt + args.steps + 2 + 63) // 64 * 64
    with tempfile.TemporaryDirectory(prefix="aotc-cppdec-") as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        art = aotc.export(model, (ids.to(device),), tmp / "g.aotc", decode=True,
                          max_cache_len=cache, target=device.type)
        export_s = time.perf_counter() - t
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        save_file({"0": ids}, tmp / "ids.safetensors")
        cmake_build(ROOT / "tests/cpp", tmp / "build")
        runs: dict = {"python runner": [], "cpp runner": [], "cpp front end, graphs": [],
                      "cpp front end, no graphs": []}
        tokens, status = {}, []
        for _ in range(args.repeats):   # interleaved
            for runner in ("python", "cpp"):
                us, tok = python_run(art, runner, ids.to(device), args.steps)
                runs[f"{runner} runner"].append(us)
                tokens[f"{runner} runner"] = tok
            for graphs in (True, False):
                us, tok, status = cpp_run(tmp / "build", art, tmp / "ids.safetensors",
                                          args.steps, graphs)
                name = f"cpp front end, {'graphs' if graphs else 'no graphs'}"
                runs[name].append(us)
                tokens[name] = tok
    ref = tokens["python runner"]
    rows = {n: {"decode_us": statistics.median(v), "runs_us": v,
                "tokens_equal_python_runner": int((tokens[n] == ref).all(0).long().cumprod(0).sum())}
            for n, v in runs.items()}
    for n, r in rows.items():
        print(f"{n:28s} {r['decode_us']:8.1f} us/step  {1e6 / r['decode_us']:7.1f} tokens/s  "
              f"tokens equal to the Python runner's: {r['tokens_equal_python_runner']}")
    print("C++ graph status (last run):", "; ".join(status))
    (args.out / "results.json").write_text(json.dumps({
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "command": " ".join(sys.argv), "commit": os.environ.get("COMMIT") or commit()[0],
        "model": args.model, "prompt": args.prompt,
        "steps": args.steps, "cache": cache, "export_s": export_s, "systems": rows,
        "cpp_graph_status": status}, indent=1))


if __name__ == "__main__":
    main()
