"""Dynamic-shape benchmark: one dynamic artifact against static artifacts at the same sizes.

    python -m benchmarks.dynamic --device cpu --threads 1 --out benchmarks/results/cpu-dynamic
    python -m benchmarks.dynamic --device cuda --dtype bf16 --out DIR        # a GPU machine

What it checks (issue "Dynamic shapes"): at the same concrete size, an artifact exported with
dynamic dims runs within 10% of one exported at exactly that size; and what the guards, checked
on every call, cost.

Per model (benchmarks/models.py's registry: mlp, cnn, transformer_block, bert, gpt2; the `small`
configs on the CPU, `full` on CUDA unless --size says otherwise):
  1. ONE dynamic artifact, exported at the model's throughput point with the batch dim dynamic
     over RANGES[size]['batch'] (and, for the sequence models, the sequence dim over
     RANGES[size]['seq']) through `aotc.export(..., dynamic_shapes=...)` with torch.export.Dims;
  2. at each point (latency: batch 1; throughput: the registry's batch; long: the throughput batch
     at twice the registry's sequence length, sequence models only) the harness's protocol
     (benchmarks/harness.py: float64 reference, build/load/first call, accuracy with
     benchmarks/accuracy.py's rule, interleaved timing, medians) on three systems: `eager`,
     `static` (an artifact exported at exactly this point's sizes) and `dynamic` (the one
     artifact of step 1, loaded afresh), both loaded with aotc.load's defaults (on a GPU, CUDA
     graphs as the runtime decides: `m.graph_status()` is recorded);
  3. dynamic/static = dynamic median / static median (within 10%: <= 1.10);
  4. guard cost: `m.entries['forward'].guards.check(args, m.device)` timed per artifact on the
     point's inputs, in blocks of calls (a single call is a few microseconds, too close to the
     timer's own cost to time alone): the median of the blocks' per-call means, and its share of
     the artifact's median call time.

Output in --out: results.json (meta with versions and the commit, summary, one record per model
and point) and results.md.
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

from benchmarks import harness, models, report, systems
from benchmarks import run as inference_run
from benchmarks.harness import Status, describe

MODELS = ("mlp", "cnn", "transformer_block", "bert", "gpt2")
# Dims made dynamic, by position in every input: batch, and seq for the sequence models.
DIMS = {"mlp": ("batch",), "cnn": ("batch",), "transformer_block": ("batch", "seq"),
        "bert": ("batch", "seq"), "gpt2": ("batch", "seq")}
# Declared ranges: they cover every point (the `small` BERT and GPT-2 have 256 positions).
RANGES = {"small": {"batch": (1, 64), "seq": (2, 256)},
          "full": {"batch": (1, 512), "seq": (2, 512)}}
POINTS = ("latency", "throughput", "long")
WITHIN = 1.10
# Per device: (warmup, min rounds, max rounds, timing seconds per point, build limit seconds).
# More rounds than the suite's: a 10% criterion on 50 us calls needs many samples.
TIMING = {"cpu": (5, 20, 2000, 3.0, 300.0), "cuda": (20, 50, 2000, 3.0, 420.0)}
GUARD_BLOCKS = 20


# ------------------------------------------------------------------------------ systems
class Artifact(systems.System):
    """aotc at one point: `static` exports at the inputs' sizes, `dynamic` loads the model's one
    dynamic artifact (`path`; `error`: why its export failed). The loaded module is kept, for
    its guards and graph status."""
    cache_env = "XDG_CACHE_HOME"   # static exports compile cold, as in systems.Aotc

    def __init__(self, name: str, target: str, path: Path | None = None,
                 error: str | None = None):
        self.name, self.target, self.path, self.error, self.module = name, target, path, error, None

    def build(self, model, inputs, workdir):
        import aotc
        if self.error:
            raise RuntimeError(f"dynamic export failed: {self.error}")
        path, build_s = self.path, None
        if path is None:
            t0 = time.perf_counter()
            path = aotc.export(model, inputs, workdir / "model.aotc", target=self.target)
            build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.module = m = aotc.load(path, device=inputs[0].device)
        load_s = time.perf_counter() - t0
        return systems.Built(call=lambda: m(*inputs), build_s=build_s, load_s=load_s,
                             artifact_bytes=systems.directory_bytes(path))


def export_dynamic(spec, size: str, model, example: tuple, target: str, workdir: Path) -> dict:
    """The model's one dynamic artifact: {path, export_s, symbols} or {error}. Every input gets
    the same Dims (same name = same size) on its leading dims."""
    import aotc
    from torch.export import Dim
    dims = {i: Dim(name, min=RANGES[size][name][0], max=RANGES[size][name][1])
            for i, name in enumerate(DIMS[spec.name])}
    try:
        with systems.environment("XDG_CACHE_HOME", str(workdir / "cache")):
            t0 = time.perf_counter()
            path = aotc.export(model, example, workdir / "dynamic.aotc", target=target,
                               dynamic_shapes=tuple(dims for _ in example))
            export_s = time.perf_counter() - t0
    except Exception as e:
        return {"error": describe(e)}
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    symbols = manifest.get("entries", {}).get("forward", {}).get("symbols")
    return {"path": path, "export_s": export_s, "symbols": symbols,
            "artifact_bytes": systems.directory_bytes(path)}


# ------------------------------------------------------------------------------ points
def points(spec, size: str, wanted: list[str]) -> list[tuple[str, int, int | None]]:
    """(point, batch, seq or None for the registry's) for the model's points in `wanted`."""
    seq = "seq" in DIMS[spec.name]
    out = [("latency", spec.batch(size, "latency"), None),
           ("throughput", spec.batch(size, "throughput"), None)]
    if seq:
        out.append(("long", spec.batch(size, "throughput"), 2 * models.SEQ[size]))
    return [p for p in out if p[0] in wanted]


def inputs_at(spec, size: str, batch: int, seq: int | None, seed: int) -> tuple:
    """The registry's inputs at `batch` (as ModelSpec.make draws them), stretched to `seq`
    along dim 1 by repeating them (token ids stay in the vocabulary)."""
    inputs = spec.inputs(size, batch, torch.Generator().manual_seed(seed))
    if seq is None:
        return inputs
    return tuple(t.repeat(1, -(-seq // t.shape[1]), *[1] * (t.dim() - 2))[:, :seq].contiguous()
                 for t in inputs)


# ---------------------------------------------------------------------------- one model
def run_model(spec, size: str, args, cfg: harness.Config, workdir: Path) -> list[dict]:
    """Every point of one model, against its one dynamic artifact."""
    device, dtype = torch.device(cfg.device), harness.DTYPES[cfg.dtype]
    model, example = spec.make(size, "throughput", cfg.seed)
    chosen = points(spec, size, args.points)
    inputs = [inputs_at(spec, size, b, s, cfg.seed) for _, b, s in chosen]
    refs = [harness.reference(model, ins, device) for ins in inputs]   # float32 model, first
    model = model.to(device=device, dtype=dtype)
    target = args.target or args.device
    dynamic = export_dynamic(spec, size, model, harness.cast(example, device, dtype), target,
                             workdir)
    rows = []
    for (point, _, _), ins, (ref, ref_error) in zip(chosen, inputs, refs):
        rec = {"model": spec.name, "family": spec.family, "point": point, "size": size,
               "batch": ins[0].shape[0], "seq": ins[0].shape[1] if len(DIMS[spec.name]) > 1
               else None, "dtype": cfg.dtype, "inputs": [_describe(t) for t in ins],
               "reference_error": ref_error, "dynamic_artifact": _public(dynamic),
               "systems": {}}
        artifacts = (Artifact("static", target),
                     Artifact("dynamic", target, dynamic.get("path"), dynamic.get("error")))
        measure_point(rec, model, harness.cast(ins, device, dtype), ref, artifacts,
                      workdir / point, cfg, args.guard_calls)
        rows.append(rec)
    return rows


def measure_point(rec: dict, model, inputs: tuple, ref, artifacts: tuple, workdir: Path,
                  cfg: harness.Config, guard_calls: int) -> None:
    """The harness's steps 4-7 on eager and the (static, dynamic) `artifacts`; then guard
    costs, graph status, the dynamic/static ratio and the point's status, into `rec`."""
    t0 = time.perf_counter()
    static, dyn = artifacts
    with torch.no_grad():
        calls = harness.measure_systems(rec["systems"], model, inputs, ref,
                                        [systems.SYSTEMS["eager"], static, dyn], workdir, cfg)
        harness.time_systems(rec["systems"], calls, torch.device(cfg.device), cfg)
    del calls
    for art in (static, dyn):
        res = rec["systems"][art.name]
        if art.module is None:
            continue
        res["graph_status"] = art.module.graph_status()
        try:
            res["guard_s"] = guard_cost(art.module, inputs, guard_calls)
        except Exception as e:
            res["guard_error"] = describe(e)
        if res.get("guard_s") and res.get("median_s"):
            res["guard_share"] = res["guard_s"] / res["median_s"]
    s, d = rec["systems"]["static"], rec["systems"]["dynamic"]
    if s.get("median_s") and d.get("median_s"):
        rec["dynamic_vs_static"] = d["median_s"] / s["median_s"]
    bad = [r["status"] for r in (s, d) if r["status"] != Status.PASS]
    rec["status"] = bad[0] if bad else Status.PASS
    harness.release()
    rec["wall_s"] = time.perf_counter() - t0


def guard_cost(module, inputs: tuple, calls: int) -> float:
    """Seconds per guard check: the median over GUARD_BLOCKS blocks of calls/GUARD_BLOCKS
    checks each of the block's mean."""
    check, args, device = module.entries["forward"].guards.check, tuple(inputs), module.device
    per = max(1, calls // GUARD_BLOCKS)
    means = []
    for _ in range(GUARD_BLOCKS):
        t0 = time.perf_counter()
        for _ in range(per):
            check(args, device)
        means.append((time.perf_counter() - t0) / per)
    return statistics.median(means)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _public(dynamic: dict) -> dict:
    """The dynamic artifact's record without its path (a temporary folder)."""
    return {k: v for k, v in dynamic.items() if k != "path"}


# ------------------------------------------------------------------------------ summary
def summarize(records: list[dict]) -> dict:
    """Over the points where both artifacts pass: geomean and worst dynamic/static, how many are
    within 10%, speedups over eager, guard costs."""
    rows = [r for r in records if r.get("systems")]
    ok = [r for r in rows if r.get("status") == Status.PASS and r.get("dynamic_vs_static")]
    worst = max(ok, key=lambda r: r["dynamic_vs_static"], default=None)
    out = {"points": len(rows), "passed": len(ok),
           "geomean_dynamic_vs_static": report.geomean(r["dynamic_vs_static"] for r in ok),
           "worst_dynamic_vs_static": worst and worst["dynamic_vs_static"],
           "worst_point": worst and f"{worst['model']} / {worst['point']}",
           "within_10pct": sum(r["dynamic_vs_static"] <= WITHIN for r in ok)}
    for name in ("static", "dynamic"):
        res = [r["systems"][name] for r in ok]
        guard_us = [x["guard_s"] * 1e6 for x in res if x.get("guard_s") is not None]
        shares = [x["guard_share"] for x in res if x.get("guard_share") is not None]
        out[name] = {"geomean_speedup": report.geomean(x.get("speedup") for x in res),
                     "median_guard_us": statistics.median(guard_us) if guard_us else None,
                     "max_guard_us": max(guard_us, default=None),
                     "max_guard_share": max(shares, default=None)}
    return out


# ------------------------------------------------------------------------------ reports
def write(out_dir: Path, meta: dict, records: list[dict]) -> dict:
    return report.write(out_dir, meta, records, plot=False, summarizer=summarize,
                        to_markdown=markdown)


def markdown(doc: dict) -> str:
    meta, records = doc["meta"], doc["results"]
    ran = [r for r in records if r.get("systems")]
    modified = meta.get("modified")
    lines = [f"# aotc dynamic shapes: {meta.get('device')}, {meta.get('dtype')}, size "
             f"{meta.get('size')}", "", report._meta_line(meta) + f"; commit {meta.get('commit')}"
             + (f" (modified: {', '.join(modified)})" if modified else ""),
             "", "## Summary", "", summary_line(doc["summary"]), ""]
    lines += _table(ran, gpu=meta.get("device") == "cuda")
    lines += ["", "## Export and load", "",
              "| model | point | static export | static load | dynamic load | dynamic first "
              "call |", "|---|---|---:|---:|---:|---:|"]
    lines += [_build_row(r) for r in ran]
    lines += ["", "Dynamic artifacts (one per model, exported once at the throughput point):", ""]
    lines += [f"- {m}: {_dyn_line(d)}" for m, d in _dynamic_artifacts(ran).items()]
    lines += _problems(records) + ["", "## Protocol", "", PROTOCOL]
    return "\n".join(lines) + "\n"


def _table(ran: list[dict], gpu: bool) -> list[str]:
    """One row per model and point; on a GPU, each artifact's graph status too."""
    head = ("| model | point | batch | seq | eager | static | dynamic | dynamic/static "
            "| speedup static / dynamic | guard us static / dynamic "
            "| guard share static / dynamic " + "| graphs static / dynamic " * gpu
            + "| status | spread |")
    rule = "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---|" * gpu + "---|---:|"
    return [head, rule] + [_row(r, gpu) for r in ran]


def summary_line(s: dict) -> str:
    if not s.get("passed"):
        return f"No point passed for both artifacts ({s.get('points', 0)} points)."
    g = lambda name, key: s[name].get(key)   # noqa: E731
    return (f"{s['passed']}/{s['points']} points pass for both artifacts. dynamic/static: "
            f"geomean {s['geomean_dynamic_vs_static']:.3f}, worst "
            f"{s['worst_dynamic_vs_static']:.3f} ({s['worst_point']}); "
            f"{s['within_10pct']}/{s['passed']} within 10%. Speedup over eager (geomean): static "
            f"{report._x(g('static', 'geomean_speedup'))}, dynamic "
            f"{report._x(g('dynamic', 'geomean_speedup'))}. Guard check per call (median, max): "
            f"static {g('static', 'median_guard_us'):.2f} / {g('static', 'max_guard_us'):.2f} us, "
            f"dynamic {g('dynamic', 'median_guard_us'):.2f} / "
            f"{g('dynamic', 'max_guard_us'):.2f} us; at most "
            f"{_share(g('dynamic', 'max_guard_share'))} of a dynamic call.")


def _row(r: dict, gpu: bool) -> str:
    e, s, d = (r["systems"].get(n, {}) for n in ("eager", "static", "dynamic"))
    ms = lambda x: report._s(x.get("median_s"), 1e3, "ms", 3)   # noqa: E731
    us = lambda x: "-" if x.get("guard_s") is None else f"{x['guard_s'] * 1e6:.2f}"   # noqa: E731
    ratio = r.get("dynamic_vs_static")
    graphs = (f"| {s.get('graph_status', {}).get('forward', '-')} / "
              f"{d.get('graph_status', {}).get('forward', '-')} " if gpu else "")
    sp = report.spread(r)
    return (f"| {r['model']} | {r['point']} | {r['batch']} | {r.get('seq') or '-'} | {ms(e)} "
            f"| {ms(s)} | {ms(d)} | {'-' if ratio is None else f'{ratio:.3f}'} "
            f"| {report._x(s.get('speedup'))} / {report._x(d.get('speedup'))} "
            f"| {us(s)} / {us(d)} | {_share(s.get('guard_share'))} / "
            f"{_share(d.get('guard_share'))} {graphs}"
            f"| {r.get('status', '-')} | {'-' if sp is None else f'{sp:.2f}'} |")


def _share(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _build_row(r: dict) -> str:
    s, d = r["systems"].get("static", {}), r["systems"].get("dynamic", {})
    return (f"| {r['model']} | {r['point']} | {report._s(s.get('build_s'))} "
            f"| {report._s(s.get('load_s'), 1e3, 'ms', 1)} "
            f"| {report._s(d.get('load_s'), 1e3, 'ms', 1)} "
            f"| {report._s(d.get('first_call_s'), 1e3, 'ms', 1)} |")


def _dynamic_artifacts(ran: list[dict]) -> dict:
    return {r["model"]: r.get("dynamic_artifact", {}) for r in ran}


def _dyn_line(d: dict) -> str:
    if d.get("error"):
        return f"export failed: {d['error']}"
    syms = ", ".join(f"{n} {v['min']}..{v['max']} (example {v.get('example')})"
                     for n, v in (d.get("symbols") or {}).items())
    return (f"{syms}; export {report._s(d.get('export_s'))}, "
            f"{report._bytes(d.get('artifact_bytes'))}")


def _problems(records: list[dict]) -> list[str]:
    out = [f"- {r['model']} / {r['point']} / {n}: **{s['status']}**: {s.get('reason', '')}"
           for r in records for n, s in r.get("systems", {}).items() if s["status"] != Status.PASS]
    out += [f"- {r['model']} / {r['point']}: float64 reference failed: {r['reference_error']}"
            for r in records if r.get("reference_error")]
    out += [f"- {r['model']}: {r['skipped']}" for r in records if r.get("skipped")]
    return ["", "## Failures and skipped", "", *out] if out else []


PROTOCOL = f"""\
One dynamic artifact per model (batch dim dynamic, and the sequence dim for sequence models, \
over the ranges listed above), exported at the throughput point. At each point: a static \
artifact exported at exactly that size; eager, static and dynamic each built, loaded (aotc.load \
defaults) and called once, outputs judged against eager and a float64 run with \
benchmarks/accuracy.py's rule; then interleaved timing (warm-up, rounds in which each runs once \
in rotating order, device synchronized after each call), medians. dynamic/static = dynamic \
median / static median; within 10% means <= {WITHIN}. Guard cost: \
`guards.check(args, device)` of the artifact's forward entry, in {GUARD_BLOCKS} blocks, the \
median of the blocks' per-call means; its share is of the artifact's median call. Spread: the \
largest median / min of the row's systems (near 1 on a quiet machine). See \
benchmarks/dynamic.py."""


# ------------------------------------------------------------------------------ command line
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dynamic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="fp32", choices=tuple(harness.DTYPES))
    p.add_argument("--size", default=None, choices=models.SIZES,
                   help="model configs (default: small on cpu, full on cuda)")
    p.add_argument("--target", default=None,
                   help="aotc.export target, e.g. cuda:sm_90 (default: the device)")
    names = inference_run._names
    p.add_argument("--models", type=names, default=list(MODELS),
                   help=f"comma-separated (default: {','.join(MODELS)})")
    p.add_argument("--points", type=names, default=list(POINTS),
                   help=f"comma-separated, from {','.join(POINTS)} (default: all)")
    p.add_argument("--guard-calls", type=int, default=2000,
                   help="guard checks timed per artifact and point")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/results/DEVICE-dynamic)")
    inference_run.add_timing_args(p)
    return p.parse_args(argv)


def environment(args, cfg, size: str) -> dict:
    """The results' `meta`: what every benchmark records (benchmarks/run.py's machine_meta),
    plus the ranges, the guard-call count and the commit measured."""
    rev, modified = inference_run.commit()
    chosen = [systems.SYSTEMS["eager"], Artifact("static", ""), Artifact("dynamic", "")]
    return {"benchmark": "dynamic shapes", "size": size, "target": args.target or args.device,
            "ranges": RANGES[size], "guard_calls": args.guard_calls, "commit": rev,
            "modified": modified,
            **inference_run.machine_meta(args, cfg, chosen, libs=("transformers",))}


def run(args) -> dict:
    if args.threads:   # before any system loads an OpenMP library of its own
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    cfg = inference_run.make_config(args, TIMING)
    size = args.size or ("small" if args.device == "cpu" else "full")
    _, specs = models.select("small", args.models)
    out = args.out or Path(__file__).parent / "results" / f"{args.device}-dynamic"
    meta = environment(args, cfg, size)
    print(f"{len(specs)} models, static vs dynamic artifacts on {args.device} {args.dtype} "
          f"({size}) -> {out}", flush=True)
    start, records = time.perf_counter(), []
    for spec in specs:
        why = spec.available()
        try:
            with tempfile.TemporaryDirectory(prefix=f"aotc-dyn-{spec.name}-") as tmp:
                rows = ([inference_run.skipped_record(spec, size, "throughput", why)] if why
                        else run_model(spec, size, args, cfg, Path(tmp)))
        except Exception as e:
            harness.release()
            rows = [inference_run.skipped_record(spec, size, "throughput",
                                                 f"benchmark error: {describe(e)}")]
        records += rows
        for rec in rows:
            print(progress_line(rec, time.perf_counter() - start), flush=True)
        meta["wall_s"] = time.perf_counter() - start
        write(out, meta, records)
    meta["load_average_at_end"] = inference_run._load_average()
    doc = write(out, meta, records)
    print(summary_line(doc["summary"]), flush=True)
    print(f"done in {time.perf_counter() - start:.0f} s: {out}/results.md", flush=True)
    return doc


def progress_line(rec: dict, elapsed: float) -> str:
    line = inference_run.progress_line(rec, elapsed, label=f"{rec['model']} / {rec['point']}")
    ratio = rec.get("dynamic_vs_static")
    return line + ("" if ratio is None else f" | dynamic/static {ratio:.3f}")


def _validate(args) -> None:
    models.select("small", args.models)
    unknown = sorted(set(args.models) - set(DIMS)) + sorted(set(args.points) - set(POINTS))
    if unknown:
        raise ValueError(f"unknown model(s) or point(s) {', '.join(unknown)}: models "
                         f"{', '.join(DIMS)}; points {', '.join(POINTS)}")


def main(argv=None) -> int:
    inference_run.quiet()
    return inference_run.checked_run(parse_args(argv), _validate, run)


if __name__ == "__main__":
    sys.exit(main())
