"""The cost of the kernels' room check (codegen/cpp/room.py): the same models exported with
it and without it (the check patched out of codegen, so the kernels take no room and the
runners pass none), every variant timed interleaved in one process, medians over rounds.

    python -m benchmarks.room --threads 1 --out benchmarks/results/cpu-room

Models: `x * 2 + 1` over 8 floats (one kernel: the runtime's own cost per call), the MLP sample
(static shapes, three kernels) and the transformer sample with dynamic batch and sequence (the
Python runner makes its room arrays per call), each with the C++ and the Python runner.
Output in --out: results.json (meta with the commit and the command; us per call of every
variant) and results.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from benchmarks.overhead import Pointwise, measure


@contextmanager
def unchecked():
    """Codegen writing kernels without the room check (as format 16 did)."""
    import aotc.codegen.cpp as cpp
    import aotc.codegen.cpp.kernel as kernel
    saved = kernel.room_check, cpp.ROOM_MARKER
    kernel.room_check, cpp.ROOM_MARKER = (lambda buffers: []), ""
    try:
        yield
    finally:
        kernel.room_check, cpp.ROOM_MARKER = saved


SAMPLES = Path(__file__).resolve().parent.parent / "samples"
MODELS = {"pointwise (1 kernel)": (None, ["8"], (8,)),
          "mlp sample (static)": ("mlp.py:Net", ["32x64"], (32, 64)),
          "transformer sample (dynamic)": ("transformer.py:Net",
                                           ["batch=2[1..8]xseq=16[2..128]x128"], (1, 16, 128))}


def export(ref, specs: list, path: Path) -> Path:
    import aotc
    from aotc.api import export_file
    from aotc.exporter.specs import parse_input_specs
    if ref is None:
        return aotc.export(Pointwise(), (torch.randn(8),), path)
    return export_file(f"{SAMPLES}/{ref}", parse_input_specs(specs), path)


def calls(tmp: Path) -> dict:
    import aotc
    out = {}
    for name, (ref, specs, shape) in MODELS.items():
        x = torch.randn(*shape)
        for label in ("checked", "unchecked"):
            dest = tmp / f"{len(out)}.aotc"
            if label == "checked":
                path = export(ref, specs, dest)
            else:
                with unchecked():
                    path = export(ref, specs, dest)
            for runner in ("cpp", "python"):
                m = aotc.load(path, runner=runner)
                out[f"{name}, {runner} runner, {label}"] = (lambda m=m, x=x: m(x))
    return out


def report(result: dict) -> str:
    m = result["us_per_call"]
    lines = ["| model, runner | checked us | unchecked us | ratio |", "|---|---:|---:|---:|"]
    for k, v in m.items():
        if k.endswith(", checked"):
            base = m[k.removesuffix("checked") + "unchecked"]
            lines.append(f"| {k.removesuffix(', checked')} | {v:.2f} | {base:.2f} | "
                         f"{v / base:.3f} |")
    meta = result["meta"]
    return "\n".join([f"# Room check cost (cpu, {meta['threads']} thread(s), torch "
                      f"{meta['torch']}, commit {meta['commit']})", "",
                      f"`{meta['command']}`", "", *lines, ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.room", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--block", type=int, default=500)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu-room"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from benchmarks.run import commit
    with tempfile.TemporaryDirectory() as tmp:
        us = measure(calls(Path(tmp)), args.rounds, args.block)
    rev, modified = commit()
    result = {"meta": {"benchmark": "room check cost", "threads": torch.get_num_threads(),
                       "torch": torch.__version__, "commit": rev, "modified": modified,
                       "command": " ".join(["python -m benchmarks.room", *sys.argv[1:]]),
                       "rounds": args.rounds, "block": args.block},
              "us_per_call": us}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
