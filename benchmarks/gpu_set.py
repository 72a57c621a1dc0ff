"""Issue 49's benchmark set, summed up: aotc against torch.compile(mode="reduce-overhead") on
every inference, training and decode point that scripts/gpu_suite.sh measured.

    python -m benchmarks.gpu_set OUT    # reads OUT/{inference,training,decode-*}/results.json

Writes OUT/results.json (meta: the commit, device and command of each part; one row per point
with aotc's ratio to the baseline), OUT/results.md and OUT/results.png. The ratio is the
baseline's median time over aotc's (decode: aotc's tokens/s over the baseline's), so above 1.0
aotc is ahead; points below 1.0, or where either system did not pass, are flagged. The
baseline is reduce-overhead where it ran (CUDA), else torch.compile (the CPU check of the
script). Decode rows also carry aotc's fraction of the roofline, and batch-8 rows the
tokens/s per sequence against the same model's batch 1.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

BASELINES = ("torch.compile:reduce-overhead", "torch.compile")
DECODE_BASELINE = "reduce-overhead"
PARTS = ("inference", "training", "decode")


def _ratio_row(kind: str, r: dict) -> dict:
    systems = r.get("systems", {})
    base = next((b for b in BASELINES if b in systems), None)
    row = {"kind": kind, "point": f"{r['model']} / {r['point']} (b{r['batch']})",
           "baseline": base, "ratio": None}
    a, b = systems.get("aotc", {}), systems.get(base, {})
    if a.get("status") == "pass" and b.get("status") == "pass":
        row["ratio"] = b["median_s"] / a["median_s"]
    else:
        row["why"] = f"aotc {a.get('status', 'absent')}, {base} {b.get('status', 'absent')}"
    return row


def _decode_rows(rows: list[dict]) -> list[dict]:
    out = []
    single = {r["model"]: r for r in rows if r["batch"] == 1}
    for r in rows:
        tps = r["decode_tokens_per_s"]
        row = {"kind": "decode", "point": f"{r['model']} decode (b{r['batch']})",
               "baseline": DECODE_BASELINE, "ratio": tps["aotc"] / tps[DECODE_BASELINE],
               "roofline": r["roofline_fraction"]["aotc"],
               "launches": r.get("decode_launches")}   # kernels and externs of aotc's step
        if r["batch"] > 1 and r["model"] in single:
            one = single[r["model"]]["decode_tokens_per_s"]["aotc"]
            row["per_sequence_vs_b1"] = tps["aotc"] / r["batch"] / one
        out.append(row)
    return out


def collect(out: Path) -> dict:
    meta, rows = {}, []
    folders = [out / "inference", out / "training",
               *sorted(p for p in out.glob("decode-*") if p.is_dir())]
    for folder in folders:
        part, path = folder.name, folder / "results.json"
        if not path.exists():
            meta[part] = {"missing": str(path)}
            continue
        doc = json.loads(path.read_text())
        meta[part] = {k: doc["meta"].get(k) for k in ("commit", "modified", "command",
                                                        "device", "gpu", "dtype", "wall_s")}
        if part.startswith("decode"):
            rows += _decode_rows(doc["rows"])
        else:
            rows += [_ratio_row(part, r) for r in doc["results"] if r.get("systems")]
    for row in rows:
        row["flag"] = row["ratio"] is None or row["ratio"] < 1.0
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    summary = {"points": len(rows), "flagged": sum(r["flag"] for r in rows),
               "geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None}
    for kind in PARTS:
        kr = [r["ratio"] for r in rows if r["kind"] == kind and r["ratio"]]
        summary[f"geomean_{kind}"] = math.exp(sum(map(math.log, kr)) / len(kr)) if kr else None
    return {"meta": {"parts": meta}, "summary": summary, "rows": rows}


def markdown(doc: dict) -> str:
    s = doc["summary"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}x"   # noqa: E731
    lines = [f"aotc against {', '.join(sorted({r['baseline'] or '-' for r in doc['rows']}))}: "
             f"geomean {fmt(s['geomean'])} over {s['points']} points "
             f"(inference {fmt(s['geomean_inference'])}, training {fmt(s['geomean_training'])}, "
             f"decode {fmt(s['geomean_decode'])}); {s['flagged']} flagged (below 1.0x or not "
             "passing).", ""]
    for part, m in doc["meta"]["parts"].items():
        lines.append(f"- {part}: " + ", ".join(f"{k} `{v}`" for k, v in m.items() if v))
    lines += ["", "| point | kind | aotc vs baseline | roofline | per sequence vs b1 | flag |",
              "|---|---|---:|---:|---:|---|"]
    for r in doc["rows"]:
        pct = lambda k: f"{r[k] * 100:.0f}%" if r.get(k) is not None else ""   # noqa: E731
        flag = "**below**" if r["ratio"] and r["ratio"] < 1 else r.get("why", "")
        lines.append(f"| {r['point']} | {r['kind']} | {fmt(r['ratio'])} | {pct('roofline')} | "
                     f"{pct('per_sequence_vs_b1')} | {flag} |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(9, 1 + 0.3 * len(rows)))
    values = [r["ratio"] or 0.0 for r in rows]
    ax.barh(range(len(rows)), values, color=["#d62728" if r["flag"] else "#2ca02c"
                                             for r in rows])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"{r['point']} [{r['kind']}]" for r in rows], fontsize=8)
    ax.invert_yaxis()
    g = doc["summary"]["geomean"]
    ax.set_xlabel("aotc speed / baseline speed (red: below 1.0x or not passing)")
    ax.set_title(f"aotc vs reduce-overhead: geomean {g:.2f}x" if g else "aotc vs baseline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    doc = collect(out)
    doc["meta"]["command"] = "python -m benchmarks.gpu_set " + str(out)
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    (out / "results.md").write_text(markdown(doc))
    plot(doc, out / "results.png")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
