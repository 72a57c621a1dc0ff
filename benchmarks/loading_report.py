"""results.md of the loading benchmark (benchmarks/loading.py): the machine's limits, then one
row per model: load and load plus first call with and without verification, the weights
phase's rate against the limits, peak memory, and the other systems' cold starts."""
from __future__ import annotations

GB = 1e9


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.0f} ms" if x < 10 else f"{x:.1f} s"


def _gb(x) -> str:
    return "-" if x is None else f"{x / GB:.2f} GB"


def _rate(x) -> str:
    return "-" if x is None else f"{x / GB:.1f} GB/s"


def _get(rec: dict, *path):
    for key in path:
        if not isinstance(rec, dict) or key not in rec:
            return None
        rec = rec[key]
    return rec


def limits_table(lim: dict) -> list[str]:
    names = [("memcpy_1t", "memcpy, 1 thread"), ("memcpy_all", "memcpy, all threads"),
             ("pagecache_read_all", f"page-cache reads, {lim.get('workers')} threads"),
             ("sha256_1t", "sha256, 1 core"), ("sha256_all", "sha256 chunks, all cores"),
             ("blake3_1t", "blake3, 1 core"), ("blake3_all", "blake3 chunks, all cores"),
             ("h2d_pinned", "host to device, pinned"),
             ("h2d_pageable", "host to device, pageable")]
    rows = ["| limit | rate |", "|---|---:|"]
    rows += [f"| {label} | {_rate(lim[k])} |" for k, label in names if k in lim]
    if "pin_alloc_1gib_s" in lim:
        rows.append(f"| pinning 1 GiB of host memory | {_ms(lim['pin_alloc_1gib_s'])} |")
    return rows


def model_rows(models: dict) -> list[str]:
    head = ("| model | dtype | weights | export | export RSS beyond the model | load verified | "
            "load unverified | ratio | load+first verified | load+first unverified | ratio | "
            "weights phase verified | rate | peak RSS verified | peak RSS unverified |")
    rows = [head, "|---|---|" + "---:|" * 13]
    for name, rec in models.items():
        v, u = _get(rec, "load", "verified") or {}, _get(rec, "load", "unverified") or {}
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"   # noqa: E731
        wbytes = _get(rec, "export", "weights_bytes")
        phase = v.get("weights")
        rows.append(" | ".join([
            f"| {name}", rec.get("dtype", "-"), _gb(wbytes), _ms(_get(rec, "export", "export_s")),
            _gb(_get(rec, "export", "export_extra_rss")), _ms(v.get("load")), _ms(u.get("load")),
            ratio(v.get("load"), u.get("load")), _ms(v.get("first")), _ms(u.get("first")),
            ratio(v.get("first"), u.get("first")), _ms(phase),
            _rate(wbytes / phase) if wbytes and phase else "-",
            _gb(_get(rec, "memory", "verified", "peak_rss")),
            _gb(_get(rec, "memory", "unverified", "peak_rss"))]) + " |")
    return rows


def baseline_rows(models: dict) -> list[str]:
    rows = ["| model | aotc load+first (verified) | torch.compile first call | "
            "AOTInductor build | AOTInductor load | AOTInductor load+first |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, rec in models.items():
        tc, ai = rec.get("torch.compile") or {}, rec.get("aotinductor") or {}
        rows.append(f"| {name} | {_ms(_get(rec, 'load', 'verified', 'first'))} | "
                    f"{_ms(tc.get('first_call_s')) if 'error' not in tc else 'failed'} | "
                    f"{_ms(ai.get('build_s')) if 'error' not in ai else 'failed'} | "
                    f"{_ms(ai.get('load_s'))} | {_ms(ai.get('load_first_s'))} |")
    return rows


def baseline_table(models: dict, meta: dict) -> list[str]:
    """This aotc against the --baseline one, measured in the same run."""
    if not any("baseline" in rec for rec in models.values()):
        return []
    rows = ["", f"## Against the baseline ({meta.get('baseline')}), same run", "",
            "| model | load verified | baseline | load unverified | baseline | "
            "load+first verified | baseline | export | baseline | export RSS beyond the model | "
            "baseline |",
            "|---|" + "---:|" * 10]
    for name, rec in models.items():
        base = rec.get("baseline", {})
        pair = lambda *path: [_ms(_get(rec, *path)), _ms(_get(base, *path))]   # noqa: E731
        rows.append(" | ".join([f"| {name}", *pair("load", "verified", "load"),
                                *pair("load", "unverified", "load"),
                                *pair("load", "verified", "first"), *pair("export", "export_s"),
                                _gb(_get(rec, "export", "export_extra_rss")),
                                _gb(_get(base, "export", "export_extra_rss"))]) + " |")
    return rows


def errors(models: dict) -> list[str]:
    out = []
    for name, rec in models.items():
        for step, r in {**rec, **{f"baseline {k}": v for k, v in
                                  rec.get("baseline", {}).items()}}.items():
            for sub in ([r] if isinstance(r, dict) and "error" in r else
                        [x for x in r.values() if isinstance(x, dict) and "error" in x]
                        if isinstance(r, dict) else []):
                last = sub["error"].strip().splitlines()[-1:] or [""]
                out.append(f"- {name} {step}: {last[0][:300]}")
    return out


def _runs(meta: dict) -> list[str]:
    """The commands of earlier runs whose records the results keep, if there were any."""
    runs = meta.get("runs", [])[:-1]
    if not runs:
        return []
    return ["", "Records kept from earlier runs of this folder:"] + [
        f"- `{r['command']}` at {r['commit']}" + (" (modified)" if r.get("modified") else "")
        + f", {r['started']}" for r in runs]


def markdown(results: dict) -> str:
    meta, lim = results.get("meta", {}), results.get("limits") or {}
    out = [f"# Loading: {meta.get('device')} ({meta.get('gpu') or str(meta.get('cpus')) + ' cpus'})",
           "", f"commit {meta.get('commit')}"
           + (f" (modified: {', '.join(meta['modified'])})" if meta.get("modified") else "")
           + f"; `{meta.get('command')}`; started {meta.get('started')}, load average "
           f"{meta.get('load_average')}", *_runs(meta), "", "## The machine's limits (same run)", "",
           *limits_table(lim), "", "## aotc", "", *model_rows(results.get("models", {})),
           "", "Times are medians; the load runs alternate verified and unverified in one "
           "process, page cache warm. Weights phase: reading, checking (and copying to the "
           "device) every stored tensor.", "", "## Cold starts of other systems", "",
           *baseline_rows(results.get("models", {})),
           *baseline_table(results.get("models", {}), meta)]
    errs = errors(results.get("models", {}))
    if errs:
        out += ["", "## Steps that failed", "", *errs]
    return "\n".join(out) + "\n"
