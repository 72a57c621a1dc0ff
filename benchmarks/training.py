"""Training-step benchmark: eager vs torch.compile vs aotc training artifacts.

    python -m benchmarks.training --device cpu --threads 1 --out benchmarks/results/cpu-training
    python -m benchmarks.training --device cuda --dtype bf16 --out DIR       # a GPU machine

One training step is what a training loop does per batch, minus the optimizer:

    for p in params: p.grad = None          # zero_grad(set_to_none=True)
    loss = projection_loss(module(*inputs))  # forward + loss
    loss.backward()                          # backward: gradients of every parameter

No optimizer step is taken (it is the same `torch.optim` code for every system and would only
dilute the differences); weights therefore stay the same from step to step. The loss is the
same for every system and computed outside the model: every floating output `o` is multiplied
by a fixed random tensor `w` of its shape and summed, `sum((o.float() * w).sum())`, so the
gradient reaches every output element with non-trivial weights (a plain sum would give zero
gradients through a final layer norm).

Systems (benchmarks/training_step.py, with the step and its measurements):
  eager          the model in train mode
  torch.compile  `torch.compile(model)` (default mode: Inductor compiles forward and backward;
                 its first step includes both compilations). Inductor's `fallback_random` is on,
                 so dropout draws from torch's generator as in eager and in aotc, and gradients
                 can be compared under one seed (it only changes how dropout masks are drawn).
  torch.compile:reduce-overhead   (CUDA) the same with CUDA graphs (cudagraph trees).
  aotc           `aotc.export(model, inputs, path, train=True, target=DEVICE)` then
                 `aotc.load(path)`: a TrainableModule whose forward and backward run the
                 artifact's compiled plans inside a torch.autograd.Function (on CUDA each
                 replays a CUDA graph, runtime/train_graphs.py).
  aotc:no-graph  (CUDA, on request) the same loaded with cuda_graph=False.

Per model (the `small` registry configs of benchmarks/models.py: mlp, cnn, transformer_block,
gpt2, bert, at their throughput batch; `--size full` for the published sizes on a GPU):
  1. model and inputs built seeded, cast to the run dtype on the device, put in train mode;
  2. reference gradients: a copy of the model and float inputs in float64, one step;
  3. per system, eager first: build (export / compile), load, first step, each in isolation
     under a time limit (failures are recorded, the run goes on);
  4. eager's step is run twice more under the same seed: gradients that are not bitwise equal
     mark every system `eager_nondeterministic`;
  5. each system's gradients (of every parameter, by name, one step under the same seed as
     eager's) are judged with benchmarks/accuracy.py's rule against eager's and the float64
     reference: a system with wrong gradients is `fail_accuracy` and its speedup never
     enters the summary;
  6. timing as in benchmarks/harness.py: warm-up, then rounds in which every system takes one
     step (interleaved, rotating order, device synchronized after each), medians;
     speedup = eager median / system median; spread = median / min;
  7. saved for backward: one more step per system with torch.autograd.graph.saved_tensors_hooks
     installed, summing the bytes of the distinct storages the step saves for backward (each
     storage counted once, a view counting its whole storage; parameters, buffers, the inputs
     and the loss weights are not counted: they exist anyway). The same measurement for every
     system (torch.compile's and aotc's autograd Functions save through the same hooks); for
     aotc the manifest's figure (what `aotc inspect` prints as "saved for backward": every
     saved tensor at its own size, parameters included) is reported too. On CUDA the step's
     peak allocation above what was allocated before it is recorded as well, and the memory a
     step holds (benchmarks/training_step.held_memory: peak reserved during a step, caches
     released first, over what was reserved before the system was built, less the system's
     own parameter copy; CUDA graph pools count here, not in the peak allocation).

Output in --out: results.json (meta, summary, one record per model) and results.md.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from benchmarks import harness, models, report, systems
from benchmarks import run as inference_run
from benchmarks.training_report import summarize, write  # noqa: F401 - summarize: API
from benchmarks.accuracy import judge
from benchmarks.harness import Status, describe, time_limit
from benchmarks.training_step import (
    STEP_SEED, SYSTEMS, TRAIN_SYSTEMS, eager_rng_in_inductor, grad_list, gradients, held_memory,
    make_step, projection_loss, projection_weights, saved_for_backward, seeded_step, select)

MODELS = ("mlp", "cnn", "transformer_block", "gpt2", "bert")
# Per device: (warmup, min rounds, max rounds, timing seconds per model, build limit seconds).
TIMING = {"cpu": (3, 10, 100, 3.0, 300.0), "cuda": (10, 20, 200, 3.0, 420.0)}


# ----------------------------------------------------------------------------- one model
def run_model(spec, size: str, point: str, chosen: list, cfg: harness.Config) -> dict:
    t_start = time.perf_counter()
    device, dtype = torch.device(cfg.device), harness.DTYPES[cfg.dtype]
    model, inputs = spec.make(size, point, cfg.seed)
    model.train()
    rec = {"model": spec.name, "family": spec.family, "point": point, "size": size,
           "batch": spec.batch(size, point), "dtype": cfg.dtype,
           "inputs": [f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in inputs],
           "params": sum(p.numel() for p in model.parameters()), "systems": {}}
    ref, rec["reference_error"] = reference_gradients(model, inputs, device)
    model = model.to(device=device, dtype=dtype)
    inputs = harness.cast(inputs, device, dtype)
    with tempfile.TemporaryDirectory(prefix=f"aotc-train-{spec.name}-") as tmp, \
            eager_rng_in_inductor():
        steps, trainees, weights = build_systems(rec["systems"], model, inputs, ref, chosen,
                                                 Path(tmp), cfg)
        harness.time_systems(rec["systems"], steps, device, cfg)
        for name, t in trainees.items():
            if rec["systems"][name].get("status") in (Status.FAIL_RUN, Status.FAIL_EXPORT):
                continue
            try:
                rec["systems"][name].update(saved_for_backward(t, weights, inputs, device))
            except Exception as e:
                rec["systems"][name]["saved_error"] = describe(e)
        eager_saved = rec["systems"].get("eager", {}).get("saved_bytes")
        for res in rec["systems"].values():
            if eager_saved and res.get("saved_bytes") is not None:
                res["saved_vs_eager"] = res["saved_bytes"] / eager_saved
        del steps, trainees
    harness.release()
    rec["wall_s"] = time.perf_counter() - t_start
    return rec


def reference_gradients(model, inputs, device) -> tuple[list | None, str | None]:
    """Gradients (eager's parameter order, on the CPU) of one float64 step, or (None, why)."""
    try:
        m64 = copy.deepcopy(model).to(device=device, dtype=torch.float64).train()
        ins = harness.cast(inputs, device, torch.float64)
        torch.manual_seed(STEP_SEED)
        out = m64(*ins)
        weights = [w.double() for w in projection_weights(out)]
        projection_loss(out, weights).backward()
        grads = gradients(m64)
        return [(torch.zeros_like(p) if grads[n] is None else grads[n]).cpu()
                for n, p in m64.named_parameters() if p.requires_grad], None
    except Exception as e:
        return None, describe(e)
    finally:
        m64 = None
        harness.release()


def build_systems(results: dict, model, inputs, ref, chosen, workdir: Path, cfg):
    """Steps 3-5: build, load, first step and gradient check per system. Returns the step
    functions to time, the trainees and the loss weights."""
    steps, trainees, eager_grads, deterministic = {}, {}, None, True
    names, like, weights = [], {}, None
    for system in chosen:
        if system.name != "eager" and eager_grads is None:
            results[system.name] = {"status": Status.SKIPPED, "reason": "eager baseline failed"}
            continue
        res, t, step, grads, w = attempt(system, model, inputs, weights, workdir / system.name,
                                         cfg)
        results[system.name] = res
        if t is None:
            continue
        steps[system.name], trainees[system.name] = step, t
        if system.name == "eager":
            weights = w
            names, like = list(grads), {n: p for n, p in t.module.named_parameters()}
            eager_grads = grad_list(grads, names, like)
            again = [grad_list(seeded_step(step, t.module), names, like) for _ in range(2)]
            deterministic = all(torch.equal(a, b) for g in again for a, b in zip(g, eager_grads))
            res["status"] = Status.PASS if deterministic else Status.EAGER_NONDETERMINISTIC
            res["grad_tensors"] = len(names)
            continue
        if not deterministic:
            res["status"] = Status.EAGER_NONDETERMINISTIC
            continue
        missing = [n for n in names if n not in grads]
        if missing:
            res.update(status=Status.FAIL_ACCURACY,
                       reason=f"no parameter named {missing[0]} ({len(missing)} missing)")
            continue
        verdict = judge(grad_list(grads, names, like), eager_grads, ref)
        res.update(status=Status.PASS if verdict.ok else Status.FAIL_ACCURACY,
                   grad_error=verdict.error, eager_grad_error=verdict.eager_error)
        if not verdict.ok:
            bad = int(verdict.reason.split("#")[1].split(":")[0]) if "#" in verdict.reason else None
            where = f" ({names[bad]})" if bad is not None and bad < len(names) else ""
            res["reason"] = f"gradient {verdict.reason}{where}"
    return steps, trainees, weights or []


def attempt(system, model, inputs, weights, workdir: Path, cfg):
    """(result, Trainee, step, first-step gradients, loss weights), the middle three None on
    failure; never raises. The first step (seeded) gives the gradients that are judged; for
    torch.compile it includes compiling forward and backward. `weights` None (eager): the loss
    weights are made from the first outputs' shapes."""
    workdir.mkdir(parents=True, exist_ok=True)
    res: dict = {"status": Status.FAIL_EXPORT}
    cuda = inputs[0].device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved()
    stage, limit = "export", None
    try:
        with time_limit(cfg.build_limit_s) as limit, systems.fresh_cache(system, workdir):
            t = system.build(model, inputs, workdir)
            res.update(build_s=t.build_s, load_s=t.load_s, artifact_bytes=t.artifact_bytes)
            if t.manifest_saved is not None:
                res.update(manifest_saved_tensors=t.manifest_saved["count"],
                           manifest_saved_bytes=t.manifest_saved["bytes"])
            stage = "run"
            t0 = time.perf_counter()
            if weights is None:
                torch.manual_seed(STEP_SEED)
                weights = projection_weights(t.forward())
            step = make_step(t, weights)
            grads = seeded_step(step, t.module)
            harness.sync(inputs)
            res["first_step_s"] = time.perf_counter() - t0
    except Exception as e:
        why = (f"timed out after {cfg.build_limit_s:g} s" if limit is not None and limit.expired
               else describe(e))
        compiling = stage == "export" or system.compiles_on_first_call
        res.update(status=Status.FAIL_EXPORT if compiling else Status.FAIL_RUN, reason=why)
        return res, None, None, None, weights
    if cuda:
        try:
            res["step_reserved_bytes"] = held_memory(step, base, t, model)
        except Exception as e:
            res["memory_error"] = describe(e)
    if system.compiles_on_first_call:
        res["build_s"] = res["first_step_s"]
    res["cold_start_s"] = (res.get("load_s") or 0.0) + res["first_step_s"]
    return res, t, step, grads, weights


# ------------------------------------------------------------------------------ command line
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="fp32", choices=tuple(harness.DTYPES))
    p.add_argument("--size", default="small", choices=models.SIZES)
    p.add_argument("--point", default="throughput", choices=models.POINTS,
                   help="batch: the registry's throughput (default) or latency batch")
    names = inference_run._names
    p.add_argument("--models", type=names, default=list(MODELS),
                   help=f"comma-separated (default: {','.join(MODELS)})")
    p.add_argument("--systems", type=names, default=None,
                   help=f"comma-separated, from {', '.join(TRAIN_SYSTEMS)} (eager always runs; "
                        f"default {', '.join(SYSTEMS['cpu'])} on cpu, "
                        f"{', '.join(SYSTEMS['cuda'])} on cuda)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/results/DEVICE-training)")
    inference_run.add_timing_args(p)
    return p.parse_args(argv)


def environment(args, cfg: harness.Config, chosen: list) -> dict:
    return {"benchmark": "training step", "size": args.size, "point": args.point,
            **inference_run.machine_meta(args, cfg, chosen, libs=("transformers",))}


def run(args) -> dict:
    if args.threads:   # before any system loads an OpenMP library of its own
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    cfg = inference_run.make_config(args, TIMING)
    device = torch.device(args.device)
    _, specs = models.select("small" if args.size == "small" else "full", args.models)
    chosen = select(args.systems, args.device)
    out = args.out or Path(__file__).parent / "results" / f"{args.device}-training"
    meta = environment(args, cfg, chosen)
    print(f"{len(specs)} models, one training step each, on {args.device} {args.dtype}: "
          f"{', '.join(s.name for s in chosen)} -> {out}", flush=True)
    start = time.perf_counter()
    systems.warm_up([systems.SYSTEMS["torch.compile"]] if any(
        s.uses_inductor for s in chosen) else [], device)
    records = []
    for spec in specs:
        why = spec.available()
        if why:
            rec = inference_run.skipped_record(spec, args.size, args.point, why)
        else:
            records.append(inference_run.skipped_record(spec, args.size, args.point,
                                                        inference_run.UNFINISHED))
            write(out, meta, records)
            records.pop()
            try:
                rec = run_model(spec, args.size, args.point, chosen, cfg)
            except Exception as e:
                harness.release()
                rec = inference_run.skipped_record(spec, args.size, args.point,
                                                   f"benchmark error: {describe(e)}")
        records.append(rec)
        print(progress_line(rec, time.perf_counter() - start), flush=True)
        meta["wall_s"] = time.perf_counter() - start
        write(out, meta, records)
    meta["load_average_at_end"] = inference_run._load_average()
    doc = write(out, meta, records)
    print(f"done in {time.perf_counter() - start:.0f} s: {out}/results.md", flush=True)
    return doc


def progress_line(rec: dict, elapsed: float) -> str:
    saved = lambda s: (f" saved {report._bytes(s['saved_bytes'])}"   # noqa: E731
                       if s.get("saved_bytes") is not None else "")
    return inference_run.progress_line(rec, elapsed, label=rec["model"], ms_digits=2,
                                       extra=saved)


def _validate(args) -> None:
    models.select("small", args.models)
    select(args.systems, args.device)


def main(argv=None) -> int:
    inference_run.quiet()
    return inference_run.checked_run(parse_args(argv), _validate, run)


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    sys.exit(main())
