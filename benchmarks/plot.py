"""results.png: speedup over eager per model and system (left) and cold start (right); and
throughput.png of the serving benchmark (plot_serving).

One row per (model, point). Left: bars from 1x to eager median / system median on a log axis
(right of the line: faster than eager); a hatched bar is a system that ran but did not pass (its
accuracy check failed, or eager was nondeterministic), a red cross at 1x one that failed to
export or run. Right: cold start (load + first call; torch.compile's first call compiles) per
system, log seconds. The legend carries each system's pass rate and geomean speedup.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

COLORS = {"eager": "#7f7f7f", "torch.compile": "#1f77b4",
          "torch.compile:reduce-overhead": "#17becf", "aotinductor": "#ff7f0e", "aotc": "#2ca02c"}
EXTRA = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22")


def color(name: str) -> str:
    return COLORS.get(name) or EXTRA[sum(map(ord, name)) % len(EXTRA)]


def plot(doc: dict, path: Path) -> None:
    rows = [r for r in doc["results"] if r.get("systems")]
    names = list(dict.fromkeys(n for r in rows for n in r["systems"]))
    fig, (ax_s, ax_c) = plt.subplots(1, 2, figsize=(15, 1.2 + 0.45 * len(rows)), sharey=True,
                                     gridspec_kw={"width_ratios": [3, 2]})
    _speedups(ax_s, rows, [n for n in names if n != "eager"], doc["summary"]["all"])
    _cold_starts(ax_c, rows, names)
    ax_s.set_yticks(range(len(rows)),
                    [f"{r['model']} / {r['point']} (b{r['batch']})" for r in rows], fontsize=9)
    ax_s.set_ylim(len(rows) - 0.5, -0.5)
    for y in range(1, len(rows)):
        for ax in (ax_s, ax_c):
            ax.axhline(y - 0.5, color="#dddddd", linewidth=0.6)
    meta = doc["meta"]
    fig.suptitle(f"aotc benchmarks: {meta.get('device')} {meta.get('dtype')}, suite "
                 f"{meta.get('suite')} ({meta.get('gpu') or meta.get('machine') or ''}, "
                 f"threads {meta.get('threads')}; torch {meta.get('torch')})", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _offsets(n: int) -> tuple[float, list[float]]:
    height = 0.8 / max(1, n)
    return height, [(i - (n - 1) / 2) * height for i in range(n)]


def _speedups(ax, rows, names, summary) -> None:
    height, offsets = _offsets(len(names))
    for name, dy in zip(names, offsets):
        for y, r in enumerate(rows):
            _speed_mark(ax, y + dy, height, r["systems"].get(name), color(name))
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ax.set_xlim(min(lo, 0.5), max(hi, 2.0) * 1.15)   # room for the labels
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("speedup over eager = eager median / system median (log scale; right of 1x "
                  "is faster)")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=color(n)) for n in names]
    labels = [_legend_label(n, summary.get(n, {})) for n in names]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="///"),
                Line2D([], [], marker="x", color="red", linestyle="")]
    labels += ["ran, did not pass accuracy", "failed to export / run"]
    ax.figure.legend(handles, labels, fontsize=9, loc="upper center", ncol=2, frameon=False,
                     bbox_to_anchor=(0.35, 0.0))
    ax.set_title("speedup over eager (higher is better)", fontsize=10)


def _legend_label(name: str, s: dict) -> str:
    gm, gm1 = s.get("geomean_speedup"), s.get("geomean_speedup_failures_as_1x")
    fmt = lambda v: f"{v:.2f}x" if v else "-"   # noqa: E731
    return (f"{name}: pass {s.get('passed', 0)}/{s.get('rows', 0)}, geomean {fmt(gm)} "
            f"(failures as 1x: {fmt(gm1)})")


def _speed_mark(ax, y: float, height: float, res: dict | None, c: str) -> None:
    if res is None or res["status"] == "skipped":
        return
    speed = res.get("speedup")
    if speed is None:
        ax.plot([1.0], [y], marker="x", color="red", markersize=7, markeredgewidth=2)
        return
    ok = res["status"] == "pass"
    ax.barh(y, speed - 1.0, left=1.0, height=height, color=c if ok else "white",
            edgecolor=c, hatch=None if ok else "///", linewidth=0.8)
    ax.annotate(f"{speed:.2f}x", (speed, y), xytext=(3 if speed >= 1 else -3, 0),
                textcoords="offset points", va="center", ha="left" if speed >= 1 else "right",
                fontsize=7)


def _cold_starts(ax, rows, names) -> None:
    height, offsets = _offsets(len(names))
    for name, dy in zip(names, offsets):
        for y, r in enumerate(rows):
            cold = (r["systems"].get(name) or {}).get("cold_start_s")
            if cold:
                ax.barh(y + dy, cold, height=height, color=color(name))
                ax.annotate(_seconds(cold), (cold, y + dy), xytext=(2, 0), fontsize=6,
                            textcoords="offset points", va="center")
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo, hi * 3)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _seconds(v)))
    ax.set_xlabel("cold start = load + first call (log scale)")
    ax.grid(axis="x", alpha=0.3)
    ax.figure.legend([Patch(color=color(n)) for n in names], names, fontsize=9, ncol=3,
                     loc="upper center", bbox_to_anchor=(0.82, 0.0), frameon=False)
    ax.set_title("cold start (lower is better; torch.compile's first call compiles)",
                 fontsize=10)


def _seconds(v: float) -> str:
    if v >= 1:
        return f"{v:.3g} s"
    return f"{v * 1e3:.3g} ms" if v >= 1e-3 else f"{v * 1e6:.3g} µs"


def plot_serving(doc: dict, path: Path) -> None:
    """throughput.png of benchmarks/serve.py: aggregate output tokens/s against concurrent
    clients, for aotc serve's continuous batching, the same requests one at a time, and
    transformers' generate over static batches where it ran."""
    rows = doc["levels"]
    xs = [r["clients"] for r in rows]
    lines = {"aotc serve (continuous batching)": [r["tokens_per_s"] for r in rows],
             "aotc serve, one request at a time": [r["baseline"]["tokens_per_s"] for r in rows]}
    if all("transformers" in r for r in rows):
        lines["transformers generate, static batches"] = [r["transformers"]["tokens_per_s"]
                                                          for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for (name, ys), c in zip(lines.items(), (COLORS["aotc"], COLORS["eager"], "#1f77b4")):
        ax.plot(xs, ys, marker="o", color=c, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("aggregate output tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{doc['model']} {doc['dtype']}, {doc['slots']} slots, {doc['device']}",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
