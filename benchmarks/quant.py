"""Quantized generators: bf16 (or fp32) against int8, int4 and fp8 weight-only aotc artifacts,
with torchao's int8 / int4 weight-only configs under torch.compile as the baseline where
torchao imports (skipped with the reason recorded otherwise).

    python -m benchmarks.quant --device cuda --dtype bf16 --models llama-1b,llama-7b \\
        --batches 1,8 --prompts 128,1024 --schemes int8,int4,fp8 --out benchmarks/results/h100-quant
    python -m benchmarks.quant --device cpu --models llama-small --batches 1 --prompts 16 \\
        --steps 8 --repeats 1 --schemes int8,int4     # the CPU path, a quick check

Per model and batch, in one process, the same seeded decoder: aotc exported as is and with
`--quantize S` for each scheme S (int4 with `--group-size`, default 64; fp8 only on GPUs of
compute capability 8.9 or later, else a recorded note), and (torchao installed) copies quantized
by torchao's Int8WeightOnlyConfig and Int4WeightOnlyConfig(group_size) run under
torch.compile(mode="reduce-overhead") with the same static-cache steps as
benchmarks/generate.py. Decode tokens/s at each batch (greedy, `--steps` steps after a prefill
of the first prompt length), prefill latency at each prompt length, load time (to the first
token), the device memory the loaded artifact holds, and each system's fraction of the roofline
of the bytes it must read a step: its own weights (values and scales for the quantized ones;
torchao's taken as aotc's of the same scheme) plus the live part of the KV cache, over the copy
rate measured in the same run. Greedy tokens of each quantized system are compared with the
unquantized aotc's (the number of steps that agree, and the first that does not), and each
manifest's export-time accuracy is copied.
"""
from __future__ import annotations

import copy
import math
import statistics
import tempfile
from functools import partial
from pathlib import Path

import torch

from benchmarks.generate import (first_divergence, greedy_time, interleaved, parse,
                                 prefill_time, run_points, write)
from benchmarks.generate_models import build_model
from benchmarks.generate_systems import Aotc, Compiled


TORCHAO = {"int8": "Int8WeightOnlyConfig", "int4": "Int4WeightOnlyConfig"}


def torchao_config(tq, scheme: str, group: int):
    """torchao's weight-only config for `scheme`: the config classes of torchao 0.10 and later
    (int4 in the tile-packed layout of PyTorch's own int4 kernel, which needs no other
    package where the class has that option), else the functions of older releases."""
    if hasattr(tq, TORCHAO[scheme]):
        make = getattr(tq, TORCHAO[scheme])
        if scheme == "int8":
            return make()
        try:
            return make(group_size=group, int4_packing_format="tile_packed_to_4d")
        except TypeError:
            return make(group_size=group)
    make = getattr(tq, f"{scheme}_weight_only")
    return make(group_size=group) if scheme == "int4" else make()


def torchao_system(model, batch: int, cache: int, scheme: str, group: int):
    """torchao's weight-only copy of `model` under torch.compile, or (None, why not)."""
    try:
        import torchao.quantization as tq
        q = copy.deepcopy(model)
        tq.quantize_(q, torchao_config(tq, scheme, group))
        return Compiled(q, batch, cache), None
    except Exception as e:       # not installed, or no kernel for this device and dtype
        return None, f"torchao {TORCHAO[scheme]}: {type(e).__name__}: {str(e)[:200]}"


def fp8_note(device: torch.device) -> str | None:
    """Why fp8 is not measured on `device`, or None."""
    if device.type != "cuda":
        return "fp8 needs a CUDA GPU of compute capability 8.9 or later"
    major, minor = torch.cuda.get_device_capability(device)
    return None if (major, minor) >= (8, 9) else f"fp8 needs sm_89+, this GPU is sm_{major}{minor}"


def device_bytes(device: torch.device, fn):
    """(fn(), device memory allocated by it and still held)."""
    if device.type != "cuda":
        return fn(), None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    return out, torch.cuda.memory_allocated(device) - before


def stored_bytes(system) -> int:
    """The bytes of the weights an artifact stores (what a decode step reads of them)."""
    return system.m.manifest.weights.bytes


def systems_for(model, batch, cache, prompt, tmp: Path, args, device):
    systems, memory, notes = {}, {}, {}
    wanted = {"aotc": {}}
    for scheme in args.schemes:
        note = fp8_note(device) if scheme == "fp8" else None
        if note:
            notes[f"aotc-{scheme}"] = note
            continue
        wanted[f"aotc-{scheme}"] = {"quantize": scheme, **(
            {"group_size": args.group_size} if scheme == "int4" else {}), **(
            {"quantize_lm_head": True} if args.quantize_lm_head else {})}
    for name, options in wanted.items():
        systems[name], memory[name] = device_bytes(device, lambda o=options, n=name: Aotc(
            model, batch, cache, prompt, tmp / f"{n}.aotc", args.target, **o))
    for scheme in ([] if args.no_torchao else [s for s in args.schemes if s in TORCHAO]):
        ao, why = torchao_system(model, batch, cache, scheme, args.group_size)
        if ao is not None:
            systems[f"torchao-{scheme}"] = ao
        else:
            notes[f"torchao-{scheme}"] = why
    return systems, memory, notes


def bench_point(name: str, batch: int, args, device, dtype, rate: float) -> dict:
    model, meta = build_model(name, device, dtype)
    cache = int(math.ceil((max(args.prompts) + args.steps + 2) / 64) * 64)
    gen = torch.Generator().manual_seed(0)
    prompts = {t: torch.randint(0, meta["vocab"], (batch, t), generator=gen).to(device)
               for t in args.prompts}
    first = args.prompts[0]
    with tempfile.TemporaryDirectory(prefix="aotc-quant-") as tmp:
        systems, memory, notes = systems_for(model, batch, cache, prompts[first], Path(tmp),
                                             args, device)
        for s in systems.values():   # warm up: compile, capture graphs
            for _ in range(2):
                greedy_time(s, prompts[first], 4)
                for p in prompts.values():
                    prefill_time(s, p)
        dec = interleaved(systems, lambda s: greedy_time(s, prompts[first], args.steps),
                          args.repeats)
        pre = {t: interleaved(systems, lambda s: prefill_time(s, p), args.repeats)
               for t, p in prompts.items()}
        weights = {n: stored_bytes(s) for n, s in systems.items() if hasattr(s, "m")}
        for n in systems:      # torchao's: taken as aotc's bytes of the same scheme
            weights.setdefault(n, weights.get(n.replace("torchao-", "aotc-")))
        accuracy = {n: s.m.manifest.quantization.accuracy for n, s in systems.items()
                    if hasattr(s, "m") and s.m.manifest.quantization is not None}
        cold = {n: s.cold for n, s in systems.items() if hasattr(s, "cold")}
    step = {n: statistics.median(t for t, _ in r) / args.steps for n, r in dec.items()}
    tokens = {n: r[0][1] for n, r in dec.items()}
    live = meta["kv_bytes_per_token"] * batch * (first + args.steps / 2)
    roof = {n: ((weights[n] or 0) + live) / rate for n in step}
    return {"model": name, "batch": batch, "params": meta["params"], "cache": cache,
            "decode_tokens_per_s": {n: batch / v for n, v in step.items()},
            "speedup_vs_aotc": {n: step["aotc"] / v for n, v in step.items()},
            "prefill_ms": {str(t): {n: statistics.median(v) * 1e3 for n, v in r.items()}
                           for t, r in pre.items()},
            "weight_bytes": weights, "roofline_step_ms": {n: v * 1e3 for n, v in roof.items()},
            "roofline_fraction": {n: roof[n] / step[n] for n in step},
            "tokens_agree_vs_aotc": {n: int((tokens[n].cpu() == tokens["aotc"].cpu()).sum())
                                     for n in tokens if n != "aotc"},
            "tokens": int(tokens["aotc"].numel()),
            "first_divergence_vs_aotc": {n: first_divergence(tokens[n], tokens["aotc"])
                                         for n in tokens if n != "aotc"},
            "export_accuracy": accuracy, "device_memory_bytes": memory,
            "load_first_token_s": {n: c["load_first_token_s"] for n, c in cold.items()},
            "export_s": {n: c["export_s"] for n, c in cold.items()}, "notes": notes}


def table(rows: list[dict]) -> str:
    lines = ["| model | batch | system | tok/s | vs unquantized aotc | roofline | prefill ms | "
             "weights | tokens agree |", "|---|---:|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        for n, tps in r["decode_tokens_per_s"].items():
            pre = ", ".join(f"{p}: {v[n]:.1f}" for p, v in r["prefill_ms"].items())
            agree = r["tokens_agree_vs_aotc"].get(n)
            agree = "-" if agree is None else f"{agree}/{r['tokens']}"
            lines.append(f"| {r['model']} | {r['batch']} | {n} | {tps:.0f} | "
                         f"{r['speedup_vs_aotc'][n]:.2f}x | "
                         f"{r['roofline_fraction'][n] * 100:.0f}% | {pre} | "
                         f"{(r['weight_bytes'][n] or 0) / 2**20:.0f} MiB | "
                         f"{agree} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    def flags(p):
        p.add_argument("--no-torchao", action="store_true", help="leave torchao's baseline out")
        p.add_argument("--schemes", default="int8,int4",
                       help="quantization schemes measured (int8, int4, fp8)")
        p.add_argument("--group-size", type=int, default=64, help="int4's group size")
        p.add_argument("--quantize-lm-head", action="store_true",
                       help="quantize the LM head too (on small vocabularies' CPU configs it "
                            "is most of the bytes a step reads)")
    args = parse(argv, flags, batches="1,8")
    args.schemes = [x for x in args.schemes.split(",") if x]
    run_points(args, bench_point,
               partial(write, benchmark="quantized generation", module="benchmarks.quant",
                       table=table))


if __name__ == "__main__":
    main()
