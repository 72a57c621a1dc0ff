"""Per-call time of mid-sized models whose forward computes values from weights or from nothing
(load-time folding, runtime/folding.py) or runs Fourier transforms (aotc::fft), against eager
in the same process.

    python -m benchmarks.percall --threads 1 --out benchmarks/results/cpu-fold-fft/head

Models (random weights, built from configs): FNet (hidden 256, 4 layers, 256 tokens: an fftn
over sequence and hidden per layer), T5's encoder (d_model 256, 4 layers, 256 tokens: its
relative position bias from index arithmetic and one embedding), wav2vec2 (hidden 256, 2
layers, one second of audio: a weight-normalised 128-tap positional convolution), X-MOD
(hidden 256, 4 layers, batch 4 of 128 tokens in three languages: each layer's language
adapters run on the rows of their language, a value-dependent size). Each is
exported by the aotc that `import aotc` finds and timed interleaved with eager: each round
times a block of calls of both, medians over rounds. Run it again with another aotc on the
path (`PYTHONPATH=<a folder whose aotc links to a worktree of another commit>`) to compare
trees; the meta records which aotc ran. Output in --out: results.json (meta with the
command, the commit of this script's tree and the aotc imported; medians in ms) and results.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def models():
    from transformers import (FNetConfig, FNetModel, T5Config, T5EncoderModel, Wav2Vec2Config,
                              Wav2Vec2Model, XmodConfig, XmodModel)
    torch.manual_seed(0)
    yield "fnet", FNetModel(FNetConfig(
        vocab_size=1000, hidden_size=256, num_hidden_layers=4, intermediate_size=512,
        max_position_embeddings=512)), (torch.randint(0, 1000, (1, 256)),)
    yield "t5-encoder", T5EncoderModel(T5Config(
        vocab_size=1000, d_model=256, d_kv=32, d_ff=512, num_layers=4,
        num_heads=8)), (torch.randint(0, 1000, (1, 256)),)
    yield "wav2vec2", Wav2Vec2Model(Wav2Vec2Config(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
        conv_dim=(64,) * 3, conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
        num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16)), (torch.randn(1, 16000),)
    yield "xmod", XmodModel(XmodConfig(
        vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=512, max_position_embeddings=258,
        languages=("en_XX", "de_DE", "fr_XX"))), (torch.randint(3, 1000, (4, 128)),
                                                   torch.tensor([0, 1, 2, 1]))


def timed(calls: dict, rounds: int, block: int) -> dict:
    for f in calls.values():
        f()
    samples = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            t = time.perf_counter()
            for _ in range(block):
                f()
            samples[k].append((time.perf_counter() - t) / block * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def one(name, model, args, tmp: Path, rounds: int, block: int) -> dict:
    import aotc
    model.eval()
    path = aotc.export(model, args, tmp / f"{name}.aotc")
    m = aotc.load(path)
    with torch.no_grad():
        ms = timed({"eager": lambda: model(*args), "aotc": lambda: m(*args)}, rounds, block)
    return {"model": name, **ms, "speedup": ms["eager"] / ms["aotc"], "runtime": m.runtime}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--models", default=None, help="comma-separated names (default: all)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import aotc
    from benchmarks.run import commit
    rev, modified = commit()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, inputs in models():
            if args.models and name not in args.models.split(","):
                continue
            records.append(one(name, model, inputs, Path(tmp), args.rounds, args.block))
            print(json.dumps(records[-1]), flush=True)
    meta = {"benchmark": "per-call time", "threads": args.threads, "torch": torch.__version__,
            "commit": rev, "modified": modified, "aotc": str(Path(aotc.__file__).parent),
            "command": "python -m benchmarks.percall " + " ".join(argv or sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "records": records},
                                                      indent=1) + "\n")
    lines = ["| model | eager ms | aotc ms | x eager |", "|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['eager']:.2f} | {r['aotc']:.2f} | {r['speedup']:.2f} |"
              for r in records]
    (args.out / "results.md").write_text(
        f"# Per-call time ({args.threads} thread(s), torch {meta['torch']}, aotc from "
        f"{meta['aotc']}, commit {rev})\n\n`{meta['command']}`\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
