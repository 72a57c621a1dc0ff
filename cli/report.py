"""What the CLI prints: `inspect` reports, output summaries, timings, verification."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from aotc.errors import VerifyError
from aotc.prove import compare
from aotc.runtime.trees import describe

# Default (rtol, atol) by output dtype for `verify`.
def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _guard_words(spec: dict) -> list[str]:
    lines = []
    for i, inp in enumerate(spec["inputs"]):
        dims = ", ".join(f"dim {d} == {s}" if isinstance(s, int) else f"dim {d} = {s}"
                         for d, s in enumerate(inp["shape"]))
        rng = f", values in [{inp['values'][0]}, {inp['values'][1]}]" if inp.get("values") else ""
        lines.append(f"  #{i} {inp['name']}: dtype {inp['dtype']}, rank {len(inp['shape'])}"
                     f"{', ' + dims if dims else ''}{rng}")
    for name, r in spec.get("symbols", {}).items():
        lines.append(f"  {r['min']} <= {name} <= {r['max']}")
    lines += [f"  {rel}" for rel in spec.get("relations", [])]
    return lines


def _entry_lines(name: str, e: dict, plan: dict | None, fusion: bool,
                 path: Path) -> list[str]:
    ins = ", ".join(f"{i['name']}: {i['dtype']}[{', '.join(map(str, i['shape']))}]"
                    for i in e["inputs"])
    st = e["stats"]
    lowered, fallback = st.get("lowered", {}), st.get("fallback", {})
    steps = st["steps"]
    out = [f"\n{name}({ins})", f"  -> {describe(e['output_tree'], e['outputs'])}",
           "guards (checked on every call):", *_guard_words(e),
           "steps:   " + ", ".join(f"{k} {v}" for k, v in steps.items()),
           f"ops:     {sum(lowered.values())} ATen calls lowered into "
           f"{st.get('kernels', 0)} generated kernels; {steps.get('extern', 0)} extern calls; "
           f"{steps.get('view', 0)} views"]
    if lowered:
        out.append("  lowered:  " + ", ".join(f"{op.split('::')[1]} x{n}"
                                              for op, n in _by_count(lowered)))
    if fallback:
        out.append("  extern:   " + ", ".join(f"{op.split('::')[1]} x{n}"
                                              for op, n in _by_count(fallback)))
    if st.get("rewrites"):
        out.append("  rewrites: " + ", ".join(f"{r} x{n}" for r, n in st["rewrites"].items()))
    out.append(f"memory:  peak planned intermediates {_bytes(st['peak_bytes'])}"
               + (f" ({_bytes(st['peak_bytes_without_reuse'])} without buffer reuse)"
                  if st.get("peak_bytes_without_reuse", st["peak_bytes"]) != st["peak_bytes"]
                  else ""))
    if fusion and plan is not None:
        out.append("kernels (what each fuses, and why):")
        for step in plan["steps"]:
            if step["kind"] == "kernel":
                out.append(f"  {step['name']}: " + " | ".join(
                    f"{'+'.join(f['ops'])} -> {','.join(f['buffers'])}" for f in step["fused"]))
                out += [f"      {r}" for r in step["reasons"]]
                tuned = _kernel_tuning(path, step)
                if tuned:
                    out.append(f"      {tuned}")
        rejected = [d for d in st.get("fusion", []) if ": not fused " in d]
        if rejected:
            out.append("fusions declined:")
            out += [f"  {d}" for d in rejected]
    return out


def _by_count(counts: dict):
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _native_text(native: dict) -> str:
    if native.get("kind") == "triton":   # CUDA artifacts (codegen/triton)
        return (f"  (Triton {native['triton']} kernels, cubins for {', '.join(native['archs'])},"
                f" sources in kernels/*.py)")
    return f"  (kernels built for {native['isa']} with {native['compiler']})"


def _config_text(c: dict) -> str:
    return (f"XBLOCK {c['xblock']}" + (f", R block {c['rblock']}" if c["rblock"] else "")
            + f", {c['num_warps']} warps")


def _autotune_text(a: dict) -> str:
    """The manifest's autotune summary (target.native.autotune) in one line."""
    if "skipped" in a:
        return f"autotune: skipped: {a['skipped']}"
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(a.get("sizes", {}).items()))
    return (f"autotune: {a['tuned']} of {a['kernels']} kernels timed on {a['device']} "
            f"({a['arch']}{', at ' + sizes if sizes else ''}) in {a['time_s']:.1f} s: "
            f"{a['changed']} changed, their launches {a['heuristic_us_total']:.1f} -> "
            f"{a['chosen_us_total']:.1f} us in all"
            + (f"; {a['rejected']} candidates rejected" if a["rejected"] else ""))


def _kernel_tuning(path: Path, step: dict) -> str | None:
    """What autotuning chose for one kernel step (from its launch spec), if it was tuned."""
    spec = (step.get("launch") or {}).get("spec")
    if spec is None or not (path / spec).is_file():
        return None
    t = json.loads((path / spec).read_text()).get("autotune")
    if t is None:
        return None
    if "heuristic_us" not in t:
        return f"autotune: {_config_text(t['chosen'])} ({t['skipped']})"
    if t["chosen"] == t["heuristic"]:
        return (f"autotune: kept {_config_text(t['chosen'])} ({t['heuristic_us']:.2f} us; "
                f"best of {len(t['candidates'])} candidates {t['best_us']:.2f} us)")
    return (f"autotune: {_config_text(t['chosen'])}, {t['chosen_us']:.2f} us (heuristic "
            f"{_config_text(t['heuristic'])}, {t['heuristic_us']:.2f} us)")


def inspect_text(path: Path, m: dict, *, fusion: bool = False) -> str:
    p = m["producer"]
    t = m["target"]
    native = t.get("native")
    out = [f"{path}  (format {m['format_version']}; aotc {p['aotc']}, torch {p['torch']}, "
           f"python {p['python']})",
           f"model:   {m['model']['name']}" + (f"  ({m['model']['source']})"
                                                if m['model'].get('source') else ""),
           f"target:  {t['device']}{':' + ','.join(t['archs']) if t['archs'] else ''}"
           + (_native_text(native) if native
              else "  (portable: extern-only plan, loads on any device)")]
    if native and "autotune" in native:
        out.append(_autotune_text(native["autotune"]))
    for name, e in m["entries"].items():
        plan = json.loads((path / e["plan"]).read_text()) if fusion else None
        out += _entry_lines(name, e, plan, fusion, path)
    if "training" in m:
        from aotc.runtime.training import saved_for_backward
        t, saved = m["training"], saved_for_backward(m)
        out.append(f"\ntraining: {len(t['params'])} parameters, {len(t['buffers'])} buffers "
                   f"({len(t['mutated'])} updated by forward); saved for backward: "
                   f"{saved['count']} tensors, {_bytes(saved['bytes'])} per step")
    w = m["weights"]
    out.append(f"\nweights: {w['count']} tensors, {_bytes(w['bytes'])}"
               + (f" ({len(w['aliases'])} tied)" if w["aliases"] else ""))
    if w.get("transposed"):
        out.append(f"  stored transposed ([K, N], for the CPU matmuls that read them): "
                   f"{len(w['transposed'])}: " + ", ".join(w["transposed"][:4])
                   + (", ..." if len(w["transposed"]) > 4 else ""))
    out.append("files:")
    out += [f"  {rel:<32} {_bytes(info['size']):>10}  sha256 {info['sha256'][:16]}"
            for rel, info in sorted(m["files"].items())]
    out.append("options: " + ", ".join(f"{k}={v}" for k, v in sorted(m["options"].items())))
    return "\n".join(out)


def describe_outputs(out, prefix: str = "output") -> str:
    if isinstance(out, torch.Tensor):
        f = out.float()
        return (f"{prefix}: {str(out.dtype).removeprefix('torch.')}{list(out.shape)}  "
                f"mean {f.mean():.4g}  std {f.std() if f.numel() > 1 else 0:.4g}")
    if isinstance(out, dict):
        return "\n".join(describe_outputs(v, f"{prefix}[{k!r}]") for k, v in out.items())
    if isinstance(out, (tuple, list)):
        return "\n".join(describe_outputs(v, f"{prefix}[{i}]") for i, v in enumerate(out))
    return f"{prefix}: {out!r}"


def time_calls(fn, runs: int, warmup: int, device: torch.device) -> dict:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"median": statistics.median(times), "p90": times[int(0.9 * (len(times) - 1))],
            "min": times[0]}


def verify_artifact(module, *, rtol=None, atol=None) -> str:
    samples = module.recorded_samples()
    if samples is None:
        raise VerifyError("the artifact holds no recorded samples", where=str(module.path),
                          expected="samples/ in the artifact", found="none",
                          fix="re-export without --no-record-samples")
    inputs, expected = samples
    got = module.run_flat("forward", inputs)
    lines = []
    for i, (g, w) in enumerate(zip(got, expected)):
        ok, diff = compare(g, w, rtol, atol)
        if not ok:
            raise VerifyError(f"output #{i} differs from the output recorded at export",
                              where=f"output #{i}", expected=f"{w.dtype}{list(w.shape)} within "
                              "tolerance", found=f"{g.dtype}{list(g.shape)}, max abs diff {diff:.3g}",
                              fix="run on the device the artifact was exported for, or pass "
                                  "--rtol/--atol if the difference is acceptable")
        lines.append(f"output #{i}: ok  ({str(w.dtype).removeprefix('torch.')}{list(w.shape)}, "
                     f"max abs diff {diff:.3g})")
    return "\n".join(lines + [f"verified {len(expected)} outputs against the export-time run"])
