"""Time one export with cold compile caches, count its kernels and the cubins compiled, and
measure its peak host memory.

    python scripts/export_time.py --model llama-1b-layers [--target cuda:sm_90] [--out DIR]

Models (random weights, built here): `llama-1b-layers` (samples/llama.py at its 1b widths and
16 layers, vocabulary 512, bf16, a decode=True generator with a 1216-position cache),
`llama-1b` (the generation benchmark's: the same at vocabulary 32000, built on the meta device
and materialised in bf16, so building never holds more than the model), `llama-7b` (the
same at size 7b: hidden 4096, 32 layers, 13.5 GB of bf16 weights),
`llama-small` (samples/llama.py's default size, fp32, a generator with a 256-position cache) and
`bert-base` (transformers' BertModel(BertConfig()), 2 x 64 tokens). Triton's cache and aotc's
C++ build cache point at fresh temporary directories, so every kernel compiles. Prints one JSON
line: seconds, kernels, how many distinct ones were compiled (cubin entries; C++ functions),
the weights' bytes, the resident memory when export began and the process's peak after it
(VmHWM; the build's own peak where that is higher). To compare trees, run this file with each
tree's aotc importable (PYTHONPATH), one after the other on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _model(name: str):
    import torch
    torch.manual_seed(0)
    if name == "llama-1b-layers":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))
        from llama import Net
        model = Net(size="1b", vocab=512).to(torch.bfloat16).eval()
        return model, (torch.randint(0, 512, (1, 16)),), {"decode": True, "max_cache_len": 1216}
    if name in ("llama-1b", "llama-7b"):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from benchmarks.generate_models import build_model
        model = build_model(name, torch.device("cpu"), torch.bfloat16)[0]
        return model, (torch.randint(0, 32000, (1, 128)),), {"decode": True,
                                                              "max_cache_len": 1216}
    if name == "llama-small":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))
        from llama import Net
        return Net().eval(), (torch.randint(0, 32000, (1, 16)),), {"decode": True,
                                                                    "max_cache_len": 256}
    if name == "bert-base":
        from transformers import BertConfig, BertModel
        return BertModel(BertConfig()).eval(), (torch.randint(0, 30000, (2, 64)),), {}
    raise SystemExit(f"unknown model {name!r}: llama-1b-layers, llama-1b, llama-7b, llama-small, "
                     "bert-base")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-layers")
    ap.add_argument("--target", default="cuda:sm_90")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton")
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "xdg")
        import aotc
        model, inputs, options = _model(args.model)
        out = args.out or Path(tmp) / "m.aotc"
        before = _status("VmRSS")
        t = time.perf_counter()
        aotc.export(model, inputs, out, target=args.target, **options)
        seconds = time.perf_counter() - t
        peak = _status("VmHWM")
        kernels, compiled = _counts(out)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        print(json.dumps({"model": args.model, "target": args.target, "aotc": aotc.__file__,
                          "export_s": round(seconds, 1), "kernels": kernels,
                          "compiled": compiled, "weights_gb": round(weights / 1e9, 2),
                          "rss_before_gb": round(before / 1e9, 2),
                          "peak_rss_gb": round(peak / 1e9, 2)}))


def _status(key: str) -> int:
    """A figure of /proc/self/status in bytes (VmHWM starts afresh at exec, as ru_maxrss,
    which counts the parent's pages at fork, does not)."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(key + ":"))


def _counts(out: Path) -> tuple[int, int]:
    """(kernels, distinct compiled kernels): cubin entries of a CUDA artifact's launch specs,
    or the C++ functions its kernel table points at."""
    import re
    specs = [json.loads(p.read_text()) for p in (out / "kernels").glob("*.json")]
    if specs:
        return len(specs), len({a["symbol"] for s in specs for a in s["archs"].values()})
    source = (out / "kernels" / "kernels.cpp").read_text()
    rows = re.findall(r'\{"(\w+)", \(void\*\)&(\w+),', source)
    return len(rows), len({fn for _, fn in rows})


if __name__ == "__main__":
    main()
