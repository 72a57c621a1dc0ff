"""The accuracy table of docs/quantization.md: each scheme's relative L2 error and greedy-token
agreement as export measures them (and stores in the manifest), on small LLaMA-shaped
generators, CPU, ATen calls only (the numbers are the quantized model's, not the kernels').

    python -m benchmarks.quant_accuracy --models llama-small,llama-cpu --out benchmarks/results/cpu-quant

Prints a Markdown table (and writes accuracy.json beside it with --out): model, scheme, layers
quantized, relative L2 error of the prompt's logits, greedy tokens agreeing / generated.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

import aotc
from benchmarks.generate_models import build_model

SCHEMES = (("int8", None), ("int4", 32), ("int4", 64), ("int4", 128))


def measure(name: str, prompt: int, lm_head: bool) -> list[dict]:
    """One row per scheme: the accuracy export records for model `name`."""
    model, meta = build_model(name, torch.device("cpu"), torch.float32)
    ids = torch.randint(0, meta["vocab"], (1, prompt), generator=torch.Generator().manual_seed(0))
    rows = []
    with tempfile.TemporaryDirectory(prefix="aotc-qacc-") as tmp:
        for scheme, group in SCHEMES:
            path = aotc.export(model, (ids,), Path(tmp) / f"{scheme}{group}.aotc", decode=True,
                               max_cache_len=prompt + 32, quantize=scheme, codegen=False,
                               quantize_lm_head=lm_head,
                               **({"group_size": group} if group else {}))
            q = aotc.load(path).manifest.quantization
            rows.append({"model": name, "scheme": scheme, "group_size": group,
                         "layers": len(q.layers), "lm_head": lm_head, **q.accuracy})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | scheme | layers | LM head | relative L2 error | greedy tokens agree |",
             "|---|---|---:|---|---:|---:|"]
    for r in rows:
        scheme = r["scheme"] + (f" g{r['group_size']}" if r["group_size"] else "")
        lines.append(f"| {r['model']} | {scheme} | {r['layers']} | "
                     f"{'quantized' if r['lm_head'] else 'fp32'} | {r['rel_l2']:.4f} | "
                     f"{r.get('tokens_agree', '-')}/{r.get('tokens', '-')} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama-small,llama-cpu")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--out", help="a directory for accuracy.json")
    args = p.parse_args(argv)
    rows = [r for name in args.models.split(",") for head in (False, True)
            for r in measure(name, args.prompt, head)]
    print(table(rows))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
