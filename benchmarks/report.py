"""Results out: the summary, results.json, results.md and results.png.

Summary per system (eager is the baseline, not summarized), over the rows (model x point) the
system was attempted on (skipped rows are left out):
  pass rate             rows with status `pass` / rows
  geomean speedup       geometric mean of eager median / system median over passing rows
  geomean (fail = 1x)   the same over all rows, a row that did not pass counting as 1.0
  medians of build (export/compile) time, load time, first-call latency, cold start
  (load + first call) and artifact size.

    python -m benchmarks.report OUT PART_DIR [PART_DIR ...]   # merge parts into one report
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

from benchmarks.plot import plot as render

PASS = "pass"
NOISY = 1.5    # a row whose spread (median / min) exceeds this was timed on a busy machine
STAT_FIELDS = ("build_s", "load_s", "first_call_s", "cold_start_s", "artifact_bytes")


# ---------------------------------------------------------------------------------- summary
def geomean(values) -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def system_names(records: list[dict]) -> list[str]:
    """Systems in the order they first appear (eager first)."""
    names: dict[str, None] = {}
    for r in records:
        names.update(dict.fromkeys(r.get("systems", {})))
    return list(names)


def summarize_system(rows: list[dict]) -> dict:
    """Summary of one system's results (`rows`: that system's per-row result dicts)."""
    rows = [r for r in rows if r["status"] != "skipped"]
    passed = [r for r in rows if r["status"] == PASS]
    out = {"rows": len(rows), "passed": len(passed),
           "pass_rate": len(passed) / len(rows) if rows else None,
           "geomean_speedup": geomean(r.get("speedup") for r in passed),
           "geomean_speedup_failures_as_1x": geomean(
               (r.get("speedup") or 1.0) if r["status"] == PASS else 1.0 for r in rows),
           "statuses": dict(Counter(r["status"] for r in rows))}
    for f in STAT_FIELDS:
        vals = [r[f] for r in rows if r.get(f) is not None]
        out[f"median_{f}"] = statistics.median(vals) if vals else None
    return out


def summarize(records: list[dict]) -> dict:
    """{'all' | 'latency' | 'throughput': {system: summary}} (eager excluded)."""
    out = {}
    for scope in ("all", "latency", "throughput"):
        rows = [r for r in records if scope == "all" or r["point"] == scope]
        out[scope] = {name: summarize_system([r["systems"][name] for r in rows
                                              if name in r.get("systems", {})])
                      for name in system_names(rows) if name != "eager"}
    return out


# ------------------------------------------------------------------------------------ write
def write(out_dir: Path, meta: dict, records: list[dict], *, plot: bool = True,
          summarizer=None, to_markdown=None) -> dict:
    """Write results.json, results.md and (with `plot`) results.png into `out_dir`; returns the
    document. The other benchmarks (training, dynamic shapes) pass their own `summarizer` and
    `to_markdown` and no plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "summary": (summarizer or summarize)(records), "results": records}
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out_dir / "results.md").write_text((to_markdown or markdown)(doc))
    if plot and any(r.get("systems") for r in records):
        render(doc, out_dir / "results.png")
    return doc


def merge(out_dir: Path, parts: list[Path]) -> dict:
    """Merge the results.json of several parts (same device, dtype, suite) into one report."""
    docs = [json.loads((p / "results.json").read_text()) for p in parts
            if (p / "results.json").is_file()]
    if not docs:
        raise SystemExit(f"no results.json under {', '.join(map(str, parts))}")
    meta = dict(docs[0]["meta"], parts=[d["meta"].get("part") for d in docs])
    meta.pop("part", None)
    meta["wall_s"] = sum(d["meta"].get("wall_s") or 0 for d in docs)
    return write(out_dir, meta, latest(d["results"] for d in docs))


def latest(parts) -> list:
    """The records of several parts, one per (model, point): a later part's measured record
    replaces an earlier one (a re-run after a fix), a skipped one never replaces a measured
    one. Order: first appearance."""
    out: dict = {}
    for records in parts:
        for r in records:
            key = (r["model"], r["point"])
            if key not in out or not r.get("skipped") or out[key].get("skipped"):
                out[key] = r
    return list(out.values())


# --------------------------------------------------------------------------------- markdown
def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _s(v, scale=1.0, unit="s", digits=2) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f} {unit}"


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def markdown(doc: dict) -> str:
    meta, records = doc["meta"], doc["results"]
    ran = [r for r in records if r.get("systems")]
    names = system_names(ran)
    lines = [f"# aotc benchmarks: {meta.get('device')}, {meta.get('dtype')}, "
             f"suite {meta.get('suite')}", "", _meta_line(meta), ""]
    lines += _summary_table(doc["summary"]), ""
    skipped = meta.get("systems_skipped", {})
    lines += [f"Not run here: {n} ({why})." for n, why in skipped.items()] + [""] * bool(skipped)
    lines += ["## Speedup over eager (eager median / system median; status if not pass)", "",
              "| model | point | batch | eager median | " + " | ".join(names[1:]) + " | spread |",
              "|---|---|---:|---:|" + "---:|" * len(names)]
    lines += [_speed_row(r, names) for r in ran]
    noisy = [r for r in ran if (spread(r) or 0) > NOISY]
    lines += ["", f"spread: the largest median / min over the row's systems. Above {NOISY} the "
              "calls were disturbed (other load on the machine): read that row's speedups with "
              f"care. Rows above it here: {len(noisy)} of {len(ran)}."]
    lines += ["", "## Cold start (build = export/compile; cold start = load + first call)", "",
              "| model | point | system | build | load | first call | cold start | artifact |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    lines += [_cold_row(r, n) for r in ran for n in names if n in r["systems"]]
    lines += _problems(records)
    lines += ["", "## Protocol", "", PROTOCOL]
    return "\n".join(lines) + "\n"


def _meta_line(meta: dict) -> str:
    keys = ("machine", "threads", "nice", "gpu", "torch", "transformers", "torchvision", "aotc",
            "matmul_precision", "started", "wall_s", "load_average_at_start",
            "load_average_at_end")
    return "; ".join(f"{k} {meta[k]:.0f} s" if k == "wall_s" else f"{k} {meta[k]}"
                     for k in keys if meta.get(k) is not None)


def _summary_table(summary: dict) -> str:
    rows = ["## Summary", "",
            "| system | points | pass rate | geomean speedup (passing) | geomean (fail = 1x) "
            "| latency geomean | throughput geomean | median build | median load "
            "| median first call | median artifact |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summary["all"].items():
        lat = summary["latency"].get(name, {}).get("geomean_speedup")
        thr = summary["throughput"].get(name, {}).get("geomean_speedup")
        rows.append(f"| {name} | {s['passed']}/{s['rows']} | {_pct(s['pass_rate'])} "
                    f"| {_x(s['geomean_speedup'])} | {_x(s['geomean_speedup_failures_as_1x'])} "
                    f"| {_x(lat)} | {_x(thr)} | {_s(s['median_build_s'])} "
                    f"| {_s(s['median_load_s'], 1e3, 'ms', 1)} "
                    f"| {_s(s['median_first_call_s'], 1e3, 'ms', 1)} "
                    f"| {_bytes(s['median_artifact_bytes'])} |")
    return "\n".join(rows)


def _speed_row(r: dict, names: list[str]) -> str:
    eager = r["systems"].get("eager", {})
    cells = []
    for n in names[1:]:
        res = r["systems"].get(n)
        if res is None:
            cells.append("-")
            continue
        status = res["status"]
        speed = _x(res.get("speedup")) if res.get("speedup") else ""
        cells.append(speed if status == PASS else f"{speed} {status}".strip())
    sp = spread(r)
    return (f"| {r['model']} | {r['point']} | {r['batch']} | "
            f"{_s(eager.get('median_s'), 1e3, 'ms', 3)} | " + " | ".join(cells)
            + f" | {'-' if sp is None else f'{sp:.2f}'} |")


def spread(r: dict) -> float | None:
    """max over systems of median / min: near 1 on a quiet machine, large under other load."""
    ratios = [s["median_s"] / s["min_s"] for s in r["systems"].values()
              if s.get("median_s") and s.get("min_s")]
    return max(ratios) if ratios else None


def _cold_row(r: dict, name: str) -> str:
    s = r["systems"][name]
    return (f"| {r['model']} | {r['point']} | {name} | {_s(s.get('build_s'))} "
            f"| {_s(s.get('load_s'), 1e3, 'ms', 1)} | {_s(s.get('first_call_s'), 1e3, 'ms', 1)} "
            f"| {_s(s.get('cold_start_s'), 1e3, 'ms', 1)} | {_bytes(s.get('artifact_bytes'))} |")


def _problems(records: list[dict]) -> list[str]:
    out = [f"- {r['model']} / {r['point']} / {n}: **{s['status']}**: {s.get('reason', '')}"
           for r in records for n, s in r.get("systems", {}).items()
           if s["status"] != PASS]
    out += [f"- {r['model']} / {r['point']}: float64 reference failed: {r['reference_error']}"
            for r in records if r.get("reference_error")]
    skipped = [f"- {r['model']} / {r['point']}: {r['skipped']}" for r in records
               if r.get("skipped")]
    return (["", "## Failures", "", *out] if out else []) + (
        ["", "## Skipped models", "", *skipped] if skipped else [])


PROTOCOL = """\
Per model and point (latency = batch 1, throughput = a larger batch): float64 reference run; \
eager run twice (bitwise-different outputs = `eager_nondeterministic`); each system built \
(export/compile), loaded and called once, each in isolation with a time limit; accuracy: every \
floating output must be allclose to eager's (rtol = atol = tol) or satisfy \
rmse(system, fp64) <= m * rmse(eager, fp64) + tol/10, with tol = 1e-4 and m = 2 for float32, \
tol = 1e-2 and m = 3 for bfloat16; integer outputs equal. Timing: warm-up, then rounds in which \
every system runs once (interleaved, rotating order, device synchronized after each call); \
medians; speedup = eager median / system median. torch.compile's first call includes its \
compilation, so it is both its build time and its cold start. See benchmarks/harness.py and \
benchmarks/accuracy.py."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Merge benchmark parts into one report.")
    p.add_argument("out", type=Path, help="folder for the merged results.{json,md,png}")
    p.add_argument("parts", type=Path, nargs="+", help="folders holding a part's results.json")
    args = p.parse_args(argv)
    doc = merge(args.out, args.parts)
    print(f"merged {len(doc['results'])} rows into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
