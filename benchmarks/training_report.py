"""The training-step benchmark's results: summary, results.json and results.md
(benchmarks/training.py measures; this module only reports)."""
from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import report
from benchmarks.harness import Status


def summarize(records: list[dict]) -> dict:
    out = {}
    for name in report.system_names(records):
        rows = [r["systems"][name] for r in records if name in r.get("systems", {})]
        rows = [r for r in rows if r["status"] != Status.SKIPPED]
        passed = [r for r in rows if r["status"] == Status.PASS]
        out[name] = {"rows": len(rows), "passed": len(passed),
                     "geomean_speedup": report.geomean(r.get("speedup") for r in passed),
                     "geomean_saved_vs_eager": report.geomean(
                         r.get("saved_vs_eager") for r in rows if r.get("saved_vs_eager")),
                     "median_build_s": _median(r.get("build_s") for r in rows),
                     "median_first_step_s": _median(r.get("first_step_s") for r in rows)}
    return out


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def write(out_dir: Path, meta: dict, records: list[dict]) -> dict:
    return report.write(out_dir, meta, records, plot=False, summarizer=summarize,
                        to_markdown=markdown)


def markdown(doc: dict) -> str:
    meta, records = doc["meta"], doc["results"]
    ran = [r for r in records if r.get("systems")]
    names = report.system_names(ran)
    lines = [f"# aotc training-step benchmark: {meta.get('device')}, {meta.get('dtype')}, "
             f"size {meta.get('size')}", "", report._meta_line(meta), ""]
    lines += _summary(doc["summary"]) + _steps(ran, names) + _peaks(ran, names)
    lines += _builds(ran, names) + _problems(records)
    lines += ["", "## Protocol", "", PROTOCOL]
    return "\n".join(lines) + "\n"


def _summary(summary: dict) -> list[str]:
    lines = ["## Summary", "",
             "| system | models passing | geomean speedup (passing) | saved for backward vs "
             "eager (geomean) | median build | median first step |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        if name == "eager":
            continue
        lines.append(f"| {name} | {s['passed']}/{s['rows']} | {report._x(s['geomean_speedup'])} "
                     f"| {report._x(s['geomean_saved_vs_eager'])} "
                     f"| {report._s(s['median_build_s'])} "
                     f"| {report._s(s['median_first_step_s'])} |")
    return lines


def _steps(ran: list, names: list) -> list[str]:
    """Speedups and bytes saved for backward, one row per model, and aotc's own figure."""
    others = names[1:]
    lines = ["", "## Training step: speedup over eager (status if not pass) and saved for "
             "backward", "",
             "| model | batch | eager step | " + " | ".join(others) + " | spread | "
             + " | ".join(f"saved {n}" for n in names) + " |",
             "|---|---:|---:|" + "---:|" * len(others) + "---:|" + "---:|" * len(names)]
    for r in ran:
        eager = r["systems"].get("eager", {})
        cells = []
        for n in others:
            s = r["systems"].get(n)
            if s is None:
                cells.append("-")
                continue
            speed = report._x(s.get("speedup")) if s.get("speedup") else ""
            cells.append(speed if s["status"] == Status.PASS else f"{speed} {s['status']}".strip())
        sp = report.spread(r)
        saved = [report._bytes(r["systems"].get(n, {}).get("saved_bytes")) for n in names]
        lines.append(f"| {r['model']} | {r['batch']} | "
                     f"{report._s(eager.get('median_s'), 1e3, 'ms', 2)} | " + " | ".join(cells)
                     + f" | {'-' if sp is None else f'{sp:.2f}'} | " + " | ".join(saved) + " |")
    lines += ["", "saved: distinct storages saved for backward by one step, measured with "
              "saved-tensor hooks, parameters, inputs and loss weights left out. spread: the "
              f"largest median / min over the row's systems (above {report.NOISY}: disturbed)."]
    aotc_rows = [r for r in ran if "manifest_saved_bytes" in r["systems"].get("aotc", {})]
    if aotc_rows:
        lines += ["", "aotc's manifest (`aotc inspect`, every saved tensor at its own size, "
                  "parameters included): " + "; ".join(
                      f"{r['model']} {r['systems']['aotc']['manifest_saved_tensors']} tensors, "
                      f"{report._bytes(r['systems']['aotc']['manifest_saved_bytes'])}"
                      for r in aotc_rows) + "."]
    return lines


def _peaks(ran: list, names: list) -> list[str]:
    lines: list[str] = []
    for key, title in (("step_peak_bytes", "Peak allocation of one step (CUDA)"),
                       ("step_reserved_bytes", "Memory a step holds beyond the parameters "
                        "(CUDA; graph pools included)")):
        if not any(key in s for r in ran for s in r["systems"].values()):
            continue
        lines += ["", f"## {title}", "",
                  "| model | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        lines += [f"| {r['model']} | " + " | ".join(
            report._bytes(r["systems"].get(n, {}).get(key)) for n in names) + " |"
            for r in ran]
    return lines


def _builds(ran: list, names: list) -> list[str]:
    lines = ["", "## Build and first step", "",
             "| model | system | build | load | first step | gradient rmse vs fp64 "
             "(eager's) |", "|---|---|---:|---:|---:|---:|"]
    for r in ran:
        for n in names:
            s = r["systems"].get(n)
            if s is None:
                continue
            err = ("-" if s.get("grad_error") is None else
                   f"{s['grad_error']:.2e} ({s.get('eager_grad_error') or 0:.2e})")
            lines.append(f"| {r['model']} | {n} | {report._s(s.get('build_s'))} "
                         f"| {report._s(s.get('load_s'), 1e3, 'ms', 1)} "
                         f"| {report._s(s.get('first_step_s'), 1e3, 'ms', 1)} | {err} |")
    return lines


def _problems(records: list) -> list[str]:
    problems = [f"- {r['model']} / {n}: **{s['status']}**: {s.get('reason', '')}"
                for r in records for n, s in r.get("systems", {}).items()
                if s["status"] != Status.PASS]
    problems += [f"- {r['model']} / {n}: saved-tensor measurement failed: {s['saved_error']}"
                 for r in records for n, s in r.get("systems", {}).items()
                 if s.get("saved_error")]
    problems += [f"- {r['model']}: float64 reference failed: {r['reference_error']}"
                 for r in records if r.get("reference_error")]
    problems += [f"- {r['model']}: {r['skipped']}" for r in records if r.get("skipped")]
    return ["", "## Failures and skipped", "", *problems] if problems else []


PROTOCOL = """\
One step = grads set to None, forward, loss = sum over floating outputs of (output * fixed \
random weights).sum(), backward; no optimizer. Models in train mode (dropout on; torch.compile \
with Inductor's fallback_random so dropout draws from torch's generator as eager and aotc do). \
Per model: float64 reference step; each system built, loaded and stepped once (seeded) in \
isolation with a time limit; eager stepped twice more (gradients must be bitwise equal); every \
parameter's gradient judged with benchmarks/accuracy.py's rule (allclose to eager at tol, else \
rmse vs float64 within m x eager's + tol/10; tol 1e-4, m 2 in float32; 1e-2, 3 in bfloat16). \
Timing: warm-up, then interleaved rounds (rotating order, device synchronized after each step); \
medians; speedup = eager median / system median. See benchmarks/training.py."""
