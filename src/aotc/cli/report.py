"""What the CLI prints: `inspect` reports, output summaries, timings, verification."""
from __future__ import annotations

import statistics
import time

import torch

from aotc.errors import UsageError, VerifyError
from aotc.runtime.aotc_ops import COLLECTIVES
from aotc.runtime.binding import signature_parameters
from aotc.runtime.cpp_runner import expected_runner
from aotc.runtime.kernels import launch_specs
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.manifest import CppNative, TritonNative
from aotc.artifact.schema.types import StepKind, size_json
from aotc.prove import matches
from aotc.artifact.trees import describe

# Default (rtol, atol) by output dtype for `verify`.
def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _dims(shape) -> str:
    return ", ".join(map(str, size_json(shape)))


def _guard_words(spec) -> list[str]:
    lines = []
    for i, inp in enumerate(spec.inputs):
        dims = ", ".join(f"dim {d} == {s}" if isinstance(s, int) else f"dim {d} = {s}"
                         for d, s in enumerate(size_json(inp.shape)))
        lines.append(f"  #{i} {inp.name}: dtype {inp.dtype}, rank {len(inp.shape)}"
                     f"{', ' + dims if dims else ''}")
    given = {d.name for inp in spec.inputs for d in inp.shape if isinstance(d, ex.Sym)}
    for name, r in spec.symbols.items():   # the others are value-dependent sizes (format 16)
        lines.append(f"  {r.min} <= {name} <= {r.max}" + ("" if name in given else
                     "  (a size the values give: read from the call that makes it, checked "
                     "there)"))
    lines += [f"  {ex.text(rel)}" for rel in spec.relations]
    return lines


def _sampling_words(spec) -> list[str]:
    """The value ranges recorded for integer inputs: what `aotc run` and random_inputs draw
    from (not checked on calls: an embedding's own index check covers its table)."""
    ranged = [(i, inp) for i, inp in enumerate(spec.inputs) if inp.values]
    if not ranged:
        return []
    return ["sampling range for random inputs (aotc run; not checked on calls):"] + [
        f"  #{i} {inp.name}: values in [{inp.values[0]}, {inp.values[1]}]" for i, inp in ranged]


def _entry_lines(name: str, e, art, fusion: bool) -> list[str]:
    ins = signature_parameters(e, [f"{i.dtype}[{_dims(i.shape)}]" for i in e.inputs])
    st = e.stats
    lowered, fallback = st.get("lowered", {}), st.get("fallback", {})
    steps = st.get("steps", {})
    out = [f"\n{name}({ins})", f"  -> {describe(e.output_tree, e.outputs)}",
           "guards (checked on every call):", *_guard_words(e), *_sampling_words(e),
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
    collectives = {op: n for op, n in fallback.items() if op in COLLECTIVES}
    if collectives:
        out.append("  collectives (torch.distributed, per call): " + ", ".join(
            f"{op.split('::')[1].split('.')[0]} x{n}" for op, n in collectives.items()))
    if st.get("rewrites"):
        out.append("  rewrites: " + ", ".join(f"{r} x{n}" for r, n in st["rewrites"].items()))
    peak = st.get("peak_bytes", 0)
    out.append(f"memory:  peak planned intermediates {_bytes(peak)}"
               + (f" ({_bytes(st['peak_bytes_without_reuse'])} without buffer reuse)"
                  if st.get("peak_bytes_without_reuse", peak) != peak else ""))
    if fusion:
        out += _fusion_lines(art, name, st)
    return out


def _fusion_lines(art, name: str, st: dict) -> list[str]:
    out = ["kernels (what each fuses, and why):"]
    for step in art.plan(name).steps:
        if step.kind is StepKind.KERNEL:
            out.append(f"  {step.name}: " + " | ".join(
                f"{'+'.join(f.get('ops', []))} -> {','.join(f.get('buffers', []))}"
                for f in step.fused))
            out += [f"      {r}" for r in step.reasons]
            tuned = _kernel_tuning(art, step)
            if tuned:
                out.append(f"      {tuned}")
    rejected = [d for d in st.get("fusion", []) if ": not fused " in str(d)]
    if rejected:
        out.append("fusions declined:")
        out += [f"  {d}" for d in rejected]
    return out


def _by_count(counts: dict):
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _native_text(native) -> str:
    if isinstance(native, TritonNative):   # CUDA artifacts (codegen/triton)
        return (f"  (Triton {native.triton} kernels, cubins for {', '.join(native.archs)},"
                f" sources in kernels/*.py)")
    return f"  (kernels built for {', '.join(native.levels)} with {native.compiler})"


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


def _kernel_tuning(art, step) -> str | None:
    """What autotuning chose for one kernel step (from its launch spec), if it was tuned."""
    if step.launch is None or not art.listed(step.launch.spec):
        return None
    t = launch_specs(art.manifest, [step.name], art.read, art.version)[step.name].autotune
    if t is None:
        return None
    if "heuristic_us" not in t:
        return f"autotune: {_config_text(t['chosen'])} ({t['skipped']})"
    if t["chosen"] == t["heuristic"]:
        return (f"autotune: kept {_config_text(t['chosen'])} ({t['heuristic_us']:.2f} us; "
                f"best of {len(t['candidates'])} candidates {t['best_us']:.2f} us)")
    return (f"autotune: {_config_text(t['chosen'])}, {t['chosen_us']:.2f} us (heuristic "
            f"{_config_text(t['heuristic'])}, {t['heuristic_us']:.2f} us)")


def inspect_text(art, *, fusion: bool = False, trusted=()) -> str:
    """The `aotc inspect` report of an open Artifact (or of the artifact at a path)."""
    if not hasattr(art, "manifest"):
        from aotc.artifact.reader import Artifact
        art = Artifact(art)
        try:
            art.verify_all()
            return inspect_text(art, fusion=fusion, trusted=trusted)
        finally:
            art.close()
    m = art.manifest
    p, t, native = m.producer, m.target, m.target.native
    out = [f"{art.root}  (format {m.format_version}; aotc {p.get('aotc')}, torch "
           f"{p.get('torch')}, python {p.get('python')})",
           f"model:   {m.model['name']}" + (f"  ({m.model['source']})"
                                             if m.model.get("source") else ""),
           f"target:  {t.device.value}{':' + ','.join(t.archs) if t.archs else ''}"
           + (_native_text(native) if native
              else "  (portable: extern-only plan, loads on any device)"),
           _signature_line(art, trusted), f"runner:  {expected_runner(m)}"]
    from aotc.runtime.tokenizer import carried
    tok = carried(art)
    if tok is not None:
        out.append(f"tokenizer: {tok.describe()}")
    if art.package is not None:
        out.append(f"package: {len(art.package.members)} members in one file of "
                   f"{_bytes(art.package.size)} (read in place; `aotc unpack` for a directory)")
    if isinstance(native, TritonNative) and native.autotune is not None:
        out.append(_autotune_text(native.autotune))
    if isinstance(native, CppNative):
        out += _levels_lines(native, m.files)
    for name, e in m.entries.items():
        out += _entry_lines(name, e, art, fusion)
    if m.training is not None:
        from aotc.runtime.training import saved_for_backward
        tr, saved = m.training, saved_for_backward(m)
        out.append(f"\ntraining: {len(tr.params)} parameters, {len(tr.buffers)} buffers "
                   f"({len(tr.mutated)} updated by forward); saved for backward: "
                   f"{saved['count']} tensors, {_bytes(saved['bytes'])} per step")
    if m.generation is not None:
        out += _generation_lines(m)
    out += _weights_lines(m)
    out += _quant_lines(m.quantization)
    out.append("files:")
    out += [f"  {rel:<40} {_bytes(info.size):>10}  {_digest_text(info)}"
            for rel, info in sorted(m.files.items())]
    out.append("options: " + ", ".join(f"{k}={v}" for k, v in sorted(m.options.items())))
    return "\n".join(out)


def _levels_lines(native, files: dict) -> list[str]:
    """The CPU levels the kernels were built for, and the one this host would load."""
    from aotc.errors import TargetError
    from aotc.runtime.native import select_level
    try:
        chosen, why = select_level(native), "this host loads it"
    except TargetError as e:
        chosen, why = None, e.what
    out = [f"levels:  {len(native.levels)} kernel libraries"
           + ("" if chosen else f" ({why})")]
    for level, rel in native.libraries:
        mark = f"  <- {why}" if level == chosen else ""
        out.append(f"  {level:<12} {rel:<32} {_bytes(files[rel].size):>10}{mark}")
    return out


def _weights_lines(m) -> list[str]:
    """The weights: how many, how large, in which shards, which are the model's state."""
    w = m.weights
    stored = w.count - len(w.aliases)
    out = [f"\nweights: {w.count} tensors, {_bytes(w.bytes)}"
           + (f" ({len(w.aliases)} tied)" if w.aliases else "")
           + f" in {len(w.shards)} shard{'s' if len(w.shards) != 1 else ''}"
           + (f" (at most {m.options['shard_size']} each)"
              if len(w.shards) > 1 and "shard_size" in m.options else "")]
    if w.state_dict is not None:
        rest = stored - len({w.stored(k) for k in w.state_dict})
        out.append(f"  state_dict: {len(w.state_dict)} keys (parameters and persistent "
                   f"buffers{', tied names included' if w.aliases else ''}); {rest} other "
                   f"stored tensor{'s' if rest != 1 else ''} (non-persistent buffers, "
                   "constants)")
    if m.tensor_parallel is not None:
        out += _parallel_lines(m.tensor_parallel)
    if w.transposed:
        out.append(f"  stored transposed ([K, N], for the CPU matmuls that read them): "
                   f"{len(w.transposed)}: " + ", ".join(w.transposed[:4])
                   + (", ..." if len(w.transposed) > 4 else ""))
    return out


def quant_accuracy_text(q) -> str:
    """One line: what --quantize measured at export against the unquantized model."""
    a = q.accuracy or {}
    rel = a.get("rel_l2")
    text = f"relative L2 error {rel:.3g}" if isinstance(rel, (int, float)) else "no error measured"
    text += " against the unquantized model"
    if isinstance(a.get("tokens"), int):
        first = a.get("first_disagreement")
        text += (f", greedy tokens agree {a.get('tokens_agree')}/{a['tokens']}"
                 + (f" (first disagreement at step {first})" if first is not None else ""))
    return text + " (eager, on the example inputs, at export)"


def _quant_lines(q) -> list[str]:
    """Quantized artifacts: each layer's scheme and the bytes it saves, and the accuracy."""
    if q is None:
        return []
    saved = sum(layer.bytes_saved for layer in q.layers.values())
    out = [f"quantized: {q.scheme} weight-only, {len(q.layers)} layers, {_bytes(saved)} saved; "
           + quant_accuracy_text(q)]
    for key, layer in q.layers.items():
        values, scales = layer.stored_shapes
        stored = "uint8 (packed int4)" if layer.scheme == "int4" else layer.scheme
        out.append(f"  {key:<40} {layer.kind:<9} {layer.describe()}, "
                   f"{layer.dtype}{list(layer.shape)} -> {stored}{list(values)} + "
                   f"float32{list(scales)}, {_bytes(layer.bytes_saved)} saved")
    return out


def _parallel_lines(tp) -> list[str]:
    """Tensor-parallel artifacts: the ranks, and which weights are split along which dim."""
    dims: dict[int, list] = {}
    for name, d in sorted(tp.sharding.items()):
        dims.setdefault(d, []).append(name)
    out = [f"  tensor parallel: world size {tp.world_size} (torch.distributed; the counts above "
           "are rank 0's); each rank loads its own shards: "
           + "; ".join(f"rank {r}: {', '.join(w.shards)}" for r, w in enumerate(tp.ranks))]
    out += [f"  split along dim {d} of the model's tensor: {len(names)}: "
            + ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            for d, names in sorted(dims.items())]
    out.append(f"  replicated: {len(tp.ranks[0].map) - len(tp.sharding)} stored tensors "
               "(norms, position embeddings, buffers)")
    return out


def _digest_text(info) -> str:
    """How a file is hashed: one sha256, or chunk digests (blake3 and sha256 per chunk)."""
    if info.chunks is None:
        return f"sha256 {info.sha256[:16]}"
    c = info.chunks
    algos = "blake3+sha256" if c.blake3 is not None else "sha256"
    return f"{algos} in {len(c.sha256)} chunk{'s' if len(c.sha256) != 1 else ''} of " \
           f"{_bytes(c.size)}"


def _generation_lines(m) -> list[str]:
    g = m.generation
    total = sum(s.nbytes for s in m.state)
    lines = [f"\ngenerator: {g.prefill} (a prompt of 1..{g.max_cache_len - 1} tokens) then "
             f"{g.decode} (one token a step); batch {g.batch}, vocab {g.vocab}, cache "
             f"{g.max_cache_len} tokens",
             f"state: {len(m.state)} tensors, {_bytes(total)} (allocated on the device at load, "
             f"zeros; updated in place by the plans; position in {g.position!r})"]
    shown = m.state[:4]
    lines += [f"  {s.name}: {s.dtype}[{_dims(s.shape)}]" for s in shown]
    if len(m.state) > len(shown):
        lines.append(f"  ... {len(m.state) - len(shown)} more")
    return lines


def _signature_line(art, trusted=None) -> str:
    """Who signed the artifact, by which method, and whether each signature verifies
    (model.sig: against the keys in `trusted` when given)."""
    from aotc.artifact import oms, signing, trust
    lines = []
    try:
        bundle = oms.read_bundle(art)
        sigs = signing.read_signatures(art)
        if bundle is not None:
            anchors = tuple(a for k in trusted or () for a in trust.anchors_of(k)
                            if a.kind in ("ec", "certificate"))
            lines.append("signed:  " + oms.describe(art, bundle, anchors))
        if sigs:
            ok = signing.verified_signers(art, sigs)
            lines.append("signed:  by " + ", ".join(f"{k} ({'valid' if v else 'INVALID'})"
                                                   for k, v in ok.items())
                         + " (Ed25519, signatures.json)")
    except UsageError as e:     # cryptography or model-signing is not installed: say so
        return f"signed:  yes (not checked: {e.what})"
    return "\n".join(lines) or "signed:  no (integrity only: the manifest's hashes)"


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
    return summarize(times)


def summarize(times: list[float]) -> dict:
    """Median, 90th percentile and minimum of call times, both percentiles interpolated
    linearly between the sorted times (so p90 >= median, whatever the count)."""
    times = sorted(times)
    p90 = statistics.quantiles(times, n=10, method="inclusive")[8] if len(times) > 1 \
        else times[0]
    return {"median": statistics.median(times), "p90": p90, "min": times[0]}


def verify_artifact(module, *, rtol=None, atol=None) -> str:
    samples = module.recorded_samples()
    if samples is None:
        raise VerifyError("the artifact holds no recorded samples", where=str(module.path),
                          expected="samples/ in the artifact", found="none",
                          fix="re-export without --no-record-samples")
    inputs, expected = samples
    q = module.manifest.quantization
    note = [f"quantized {q.scheme}: {quant_accuracy_text(q)}"] if q is not None else []
    if getattr(module, "generation", None) is not None:
        return "\n".join(note + [_verify_generation(module, inputs[0], expected[0])])
    reference = module.recorded_reference(expected)
    got = module.run_flat("forward", inputs)
    lines = []
    for i, (g, w) in enumerate(zip(got, expected)):
        ok, text = matches(g, w, reference.get(i), rtol, atol)
        if not ok:
            raise VerifyError(f"output #{i} differs from the output recorded at export",
                              where=f"output #{i}", expected=f"{w.dtype}{list(w.shape)} within "
                              "tolerance", found=f"{g.dtype}{list(g.shape)}, {text}",
                              fix="run on the device the artifact was exported for, or pass "
                                  "--rtol/--atol if the difference is acceptable")
        lines.append(f"output #{i}: ok  ({str(w.dtype).removeprefix('torch.')}{list(w.shape)}, "
                     f"{text})")
    return "\n".join(note + lines
                     + [f"verified {len(expected)} outputs against the export-time run"])


def _verify_generation(module, prompt: torch.Tensor, want: torch.Tensor) -> str:
    """A generator's greedy tokens for the recorded prompt against eager's at export."""
    got = module.generate(prompt, want.shape[1] - prompt.shape[1]).cpu()
    module.reset()
    want = want.cpu()
    if not torch.equal(got, want):
        differ = (got != want).any(0).nonzero()
        first = int(differ[0]) - prompt.shape[1]
        raise VerifyError(f"generated token {first} differs from the one eager PyTorch chose "
                          "at export", where=f"new token {first}",
                          expected=want[:, prompt.shape[1]:].tolist(),
                          found=got[:, prompt.shape[1]:].tolist(),
                          fix="greedy ties can flip in low precision: compare the logits, or "
                              "run on the device the artifact was exported for")
    n = want.shape[1] - prompt.shape[1]
    return f"verified {n} greedy tokens (batch {want.shape[0]}) against the export-time run"
