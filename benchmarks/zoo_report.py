"""The zoo's results as JSON and markdown: a pass rate over the models torch.export can
capture (the others reported apart, with the message each gets), and one row per model with
its export time beside torch.compile's compile time from the same run."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

EXPORT_BUDGET_S = 20.0   # small configs on the CPU (the zoo's export-time requirement)
APART = ("capture_failed", "build_failed", "skipped")   # not counted in the pass rate


def summarize(records: list[dict]) -> dict:
    statuses = Counter(r["status"] for r in records)
    capturable = [r for r in records if r["status"] not in APART]
    passed = [r for r in capturable if r["status"] == "pass"]
    over = [r["model"] for r in passed if over_budget(r)]
    return {"models": len(records), "statuses": dict(statuses),
            "capturable": len(capturable), "passed": len(passed),
            "pass_rate": round(len(passed) / len(capturable), 4) if capturable else None,
            "over_export_budget": over}


def over_budget(r: dict) -> bool:
    """Export slower than torch.compile's first call in the same run, or than 20 s."""
    export, compiled = r.get("export_s"), r.get("compile_s")
    if export is None:
        return False
    return export > EXPORT_BUDGET_S or (compiled is not None and export > compiled)


def write(out: Path, doc: dict) -> None:
    doc = dict(doc, summary=summarize(doc["records"]))
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "results.md").write_text(markdown(doc))


def _s(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def markdown(doc: dict) -> str:
    m, s, recs = doc["meta"], doc["summary"], doc["records"]
    lines = [f"# aotc zoo ({m['size']} configs)", "",
             f"`{m['command']}` at {m['commit']}{'' if m['clean_tree'] else ' (modified tree)'},"
             f" torch {m['torch']}, transformers {m.get('transformers')}, torchvision "
             f"{m.get('torchvision')}, timm {m.get('timm')}, {m['threads']} threads, "
             f"{m['started']}", "",
             f"**{s['passed']}/{s['capturable']} pass** ({_pct(s['pass_rate'])}) of the models "
             f"torch.export can capture; {s['models']} models in all; statuses "
             + ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items()))
             + f"; over the export budget: {', '.join(s['over_export_budget']) or 'none'}.", "",
             *([m["note"], ""] if m.get("note") else []),
             *([f"{m['jobs']} models were checked at once: times are of exports run side by "
                "side.", ""] if m.get("jobs", 1) > 1 else []),
             "| family | model | status | export s | torch.compile s | kernels | externs | "
             "error |", "|---|---|---|---:|---:|---:|---:|---|"]
    for r in recs:
        if r["status"] in APART:
            continue
        err = "" if r["status"] == "pass" else f"{r.get('error_class', '')}: " \
            f"{_short(r.get('message', ''))}"
        lines.append(f"| {r['family']} | {r['model']} | {r['status']} | {_s(r.get('export_s'))}"
                     f" | {_s(r.get('compile_s'))} | {r.get('kernels', '-')} | "
                     f"{r.get('externs', '-')} | {err} |")
    apart = [r for r in recs if r["status"] in APART]
    if apart:
        lines += ["", "## Reported apart: not capturable by torch.export, or not buildable", "",
                  "| family | model | status | message |", "|---|---|---|---|"]
        lines += [f"| {r['family']} | {r['model']} | {r['status']} | "
                  f"{_short(r.get('message', ''), 600)} |" for r in apart]
    return "\n".join(lines) + "\n"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _short(text: str, limit: int = 160) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def line(i: int, n: int, r: dict) -> str:
    """One console line per model as the run goes."""
    times = f"export {_s(r.get('export_s'))} s, torch.compile {_s(r.get('compile_s'))} s"
    why = "" if r["status"] == "pass" else f": {r.get('error_class')}: " \
        f"{_short(r.get('message', ''), 200)}"
    return f"[{i}/{n}] {r['family']}/{r['model']}: {r['status']} ({times}){why}"


def summary_line(records: list[dict]) -> str:
    s = summarize(records)
    return (f"{s['passed']}/{s['capturable']} pass ({_pct(s['pass_rate'])}) of the capturable "
            f"models; statuses {s['statuses']}; over budget: {s['over_export_budget']}")
