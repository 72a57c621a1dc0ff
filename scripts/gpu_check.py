"""GPU check for aotc's CUDA backend: export, load and compare with eager on a real GPU.

On a GPU machine (torch with CUDA, triton, transformers, torchvision):

    python scripts/gpu_check.py                       # every model, fp32 and bf16, this GPU's arch
    python scripts/gpu_check.py --arch sm_90 --models mlp,gpt2 --dtypes fp32
    python scripts/gpu_check.py --models all          # + every other benchmark-suite model
    python scripts/gpu_check.py --prebuilt /path/a.aotc /path/b.aotc   # + cubins built elsewhere

On a machine without a GPU, build artifacts to carry over (cross-compiled cubins):

    python scripts/gpu_check.py --cross-build OUT_DIR --arch sm_90

Each model is exported for `cuda:<arch>` (Triton kernels compiled to cubins), loaded with
`aotc.load` (cubins through the CUDA driver API, no Triton), run on CUDA and compared with the
same model run eagerly on CUDA; the table shows errors, kernel counts, export/load times and
median latencies. Prebuilt artifacts are checked against the eager outputs recorded when they
were exported. A few runtime checks follow (index errors, side streams, threads, dynamic sizes,
CUDA graphs), then the bandwidth that single fused kernels reach (the roofline fraction).
Exit status 1 if anything fails.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch

import aotc

ROOT = Path(__file__).resolve().parents[1]   # the source tree (samples/ is not installed)
TOL = {"fp32": (2e-3, 2e-3), "bf16": (6e-2, 6e-2)}
DTYPES = {"fp32": None, "bf16": "bf16"}


def _sample(ref: str):
    def build():
        from aotc.exporter.loader import load_model
        return load_model(str(ROOT / "samples" / ref), None)
    return build


def _resnet18():
    import torchvision
    return torchvision.models.resnet18(weights=None)


def _ids():
    return (torch.randint(0, 1000, (2, 32)),)


MODELS = {   # name -> (build, example inputs)
    "mlp": (_sample("mlp.py:Net"), lambda: (torch.randn(32, 64),)),
    "cnn": (_sample("cnn.py:Net"), lambda: (torch.randn(8, 3, 32, 32),)),
    "transformer": (_sample("transformer.py:Net"), lambda: (torch.randn(2, 64, 128),)),
    "gpt2": (_sample("hf_models.py:gpt2"), _ids),
    "bert": (_sample("hf_models.py:bert"), _ids),
    "resnet18": (_resnet18, lambda: (torch.randn(8, 3, 224, 224),)),
}


def _registry(spec):
    """A benchmark-suite model (benchmarks/models.py) at its small size, latency batch."""
    return (lambda: spec.make("small", "latency")[0],
            lambda: spec.make("small", "latency")[1])


def suite_models() -> dict:
    """Every benchmark-suite model the checks above do not cover (`--models all`): DistilBERT,
    LLaMA, T5, ViT and the torchvision models, at the suite's small configs."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import models
    covered = {"mlp", "cnn", "transformer_block", "gpt2", "bert", "resnet18"}
    return {s.name: _registry(s) for s in models.REGISTRY if s.name not in covered}


def flat(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict) or hasattr(value, "keys"):
        return [t for k in value.keys() for t in flat(value[k])]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat(v)]
    return []


def errors(got, want) -> tuple[float, float]:
    """(max abs error, max error relative to the reference's largest magnitude)."""
    abs_err = rel = 0.0
    for g, w in zip(flat(got), flat(want)):
        if not g.is_floating_point():
            abs_err = max(abs_err, float((g != w).sum()))
            continue
        d = (g.float() - w.float().to(g.device)).abs().max().item() if g.numel() else 0.0
        scale = max(w.float().abs().max().item(), 1e-6) if w.numel() else 1.0
        abs_err, rel = max(abs_err, d), max(rel, d / scale)
    return abs_err, rel


def median_ms(fn, runs: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def check_model(name: str, dtype: str, arch: str, out: Path) -> dict:
    build, make_inputs = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    inputs = make_inputs()
    t = time.perf_counter()
    path = aotc.export(model, inputs, out / f"{name}_{dtype}.aotc", target=f"cuda:{arch}",
                       dtype=DTYPES[dtype])
    export_s = time.perf_counter() - t
    t = time.perf_counter()
    m = aotc.load(path)
    load_s = time.perf_counter() - t
    cast = (lambda x: x.to(torch.bfloat16) if x.is_floating_point() else x) \
        if dtype == "bf16" else (lambda x: x)
    dev_inputs = tuple(cast(x).cuda() for x in inputs)
    ref_model = model.cuda().to(torch.bfloat16) if dtype == "bf16" else model.cuda()
    with torch.no_grad():
        want = ref_model(*dev_inputs)
        got = m(*dev_inputs)
        eager_ms = median_ms(lambda: ref_model(*dev_inputs))
    aotc_ms = median_ms(lambda: m(*dev_inputs))
    plain = aotc.load(path, cuda_graph=False)
    plain_ms = median_ms(lambda: plain(*dev_inputs))
    abs_err, rel = errors(got, want)
    stats = m.manifest.entries["forward"].stats
    return dict(case=f"{name} {dtype} [{m.graph_status()['forward']}]",
                ok=rel <= TOL[dtype][1] or abs_err <= TOL[dtype][0],
                abs=abs_err, rel=rel, kernels=stats.get("kernels", 0), export_s=export_s,
                load_s=load_s, eager_ms=eager_ms, aotc_ms=aotc_ms, plain_ms=plain_ms)


def check_prebuilt(path: Path) -> dict:
    t = time.perf_counter()
    m = aotc.load(path)
    load_s = time.perf_counter() - t
    ins, outs = m.recorded_samples()
    with torch.no_grad():
        got = m.run_flat("forward", ins)
        aotc_ms = median_ms(lambda: m.run_flat("forward", ins))
    abs_err, rel = errors(got, outs)
    native = m.manifest.target.native
    return dict(case=f"prebuilt {path.name} (triton {getattr(native, 'triton', None)}, "
                     f"{','.join(getattr(native, 'archs', ()))})",
                ok=rel <= 2e-3 or abs_err <= 2e-3, abs=abs_err, rel=rel,
                kernels=m.manifest.entries["forward"].stats.get("kernels", 0),
                export_s=float("nan"), load_s=load_s, eager_ms=float("nan"), aotc_ms=aotc_ms)


# ---------------------------------------------------------------------------- runtime checks

def runtime_checks(arch: str, out: Path) -> list[dict]:
    """Index errors (with and without a CUDA graph), side streams, threads, graph replays and
    dynamic sizes on the GPU: one row each, a failure reported and the rest still run."""
    import torch.nn.functional as F
    from aotc.api import compile_function
    table, ids, x = torch.randn(10, 4), torch.tensor([[1, 2], [3, 4]]), torch.randn(64, 256)
    emb = compile_function(lambda t, i: F.embedding(i, t) * 2, (table, ids), out / "emb.aotc",
                           target=f"cuda:{arch}")
    soft = compile_function(lambda x: torch.softmax(x * 3, -1), (x,), out / "soft.aotc",
                            target=f"cuda:{arch}")
    checks = {
        "index out of range -> GuardError": lambda: check_index_error(emb, table, ids, False),
        "launch on a side stream": lambda: check_side_stream(soft, x),
        "4 threads calling one module": lambda: check_threads(soft, x),
        "CUDA graph: capture, replay, outputs owned by the caller":
            lambda: check_graph_replays(soft, x),
        "CUDA graph: index out of range -> GuardError":
            lambda: check_index_error(emb, table, ids, True),
        "dynamic seq 2..256 (transformer), a graph per size": lambda: check_dynamic(arch, out),
        "sharded weights streamed to the GPU in checked chunks; a damaged shard refused":
            lambda: check_streamed_shards(arch, out),
        "load_state_dict under a CUDA graph: the replay reads the new weights":
            lambda: check_swap_under_graph(arch, out),
    }
    rows = []
    for case, fn in checks.items():
        try:
            fn()
            rows.append(dict(case=case, ok=True))
        except Exception as e:   # report and go on
            rows.append(dict(case=case, ok=False, note=f"{type(e).__name__}: {e}"[:200]))
    return rows


def check_index_error(emb: Path, table, ids, cuda_graph: bool) -> None:
    import torch.nn.functional as F
    m = aotc.load(emb, cuda_graph=cuda_graph)
    t, good = table.cuda(), ids.cuda()
    torch.testing.assert_close(m(t, good), F.embedding(good, t) * 2)
    if cuda_graph:
        assert m.graph_status()["forward"] == "graph", m.graph_status()
    try:
        m(t, torch.tensor([[1, 2], [3, 40]]).cuda())
        raise AssertionError("an out-of-range index was not reported")
    except aotc.GuardError:
        pass
    torch.testing.assert_close(m(t, good), F.embedding(good, t) * 2)


def check_side_stream(soft: Path, x) -> None:
    m, xs = aotc.load(soft), x.cuda()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = m(xs)
    s.synchronize()
    torch.testing.assert_close(y, torch.softmax(xs * 3, -1))


def check_threads(soft: Path, x) -> None:
    m, xs = aotc.load(soft), x.cuda()
    want, errs = torch.softmax(xs * 3, -1), []

    def work():
        try:
            for _ in range(20):
                torch.testing.assert_close(m(xs), want)
        except Exception as e:
            errs.append(e)
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]


def check_graph_replays(soft: Path, x) -> None:
    m, xs = aotc.load(soft, cuda_graph=True), x.cuda()
    assert m.graph_status()["forward"] == "pending", m.graph_status()
    y1 = m(xs)
    assert m.graph_status()["forward"] == "graph", m.graph_status()
    x2 = torch.randn_like(xs)
    y2 = m(x2)          # a replay reads the new input ...
    torch.testing.assert_close(y2, torch.softmax(x2 * 3, -1))
    torch.testing.assert_close(y1, torch.softmax(xs * 3, -1))   # ... and y1 is unchanged
    torch.testing.assert_close(m(xs.t().contiguous().t()), y1)   # strided input copied in


def check_streamed_shards(arch: str, out: Path) -> None:
    """Weights in 3+ shards of 1 KiB chunks: streamed through pinned staging buffers and
    checked chunk by chunk (runtime/transfer.py); a flipped byte refused."""
    import shutil
    from aotc.artifact import hashing
    torch.manual_seed(0)
    model = _sample("mlp.py:Net")().eval()
    x = torch.randn(32, 64)
    old, hashing.CHUNK = hashing.CHUNK, 1024
    try:
        p = aotc.export(model, (x,), out / "shards.aotc", target=f"cuda:{arch}",
                        shard_size="20KB")
    finally:
        hashing.CHUNK = old
    shards = sorted(p.glob("weights-*.safetensors"))
    assert len(shards) >= 3, shards
    torch.testing.assert_close(aotc.load(p)(x.cuda()), model.cuda()(x.cuda()).float(),
                               rtol=2e-3, atol=2e-3)
    bad = shutil.copytree(p, out / "shards-bad.aotc", dirs_exist_ok=True)
    data = bytearray((bad / shards[1].name).read_bytes())
    data[len(data) // 2] ^= 1
    (bad / shards[1].name).write_bytes(bytes(data))
    try:
        aotc.load(bad)
        raise AssertionError("a damaged shard was loaded")
    except aotc.ArtifactError as e:
        assert "chunk" in str(e), e


def check_swap_under_graph(arch: str, out: Path) -> None:
    torch.manual_seed(0)
    model = _sample("cnn.py:Net")().eval()
    x = torch.randn(8, 3, 32, 32)
    p = aotc.export(model, (x,), out / "swap.aotc", target=f"cuda:{arch}")
    m, xs = aotc.load(p, cuda_graph=True), x.cuda()
    m(xs)
    assert m.graph_status()["forward"] == "graph", m.graph_status()
    new = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
           for k, v in model.state_dict().items()}
    model.load_state_dict(new)
    m.load_state_dict(new)
    assert m.graph_status()["forward"] == "graph", m.graph_status()
    torch.testing.assert_close(m(xs), model.cuda()(xs), rtol=2e-3, atol=2e-3)


def check_dynamic(arch: str, out: Path) -> None:
    from torch.export import Dim
    torch.manual_seed(0)
    model = _sample("transformer.py:Net")().eval()
    seq = Dim("seq", min=2, max=256)
    p = aotc.export(model, (torch.randn(2, 64, 128),), out / "dyn.aotc",
                    target=f"cuda:{arch}", dynamic_shapes=({1: seq},))
    m, ref = aotc.load(p), model.cuda()
    for s in (2, 17, 64, 200, 17, 200, 2):   # a size's second call captures its graph
        xs = torch.randn(2, s, 128, device="cuda")
        with torch.no_grad():
            torch.testing.assert_close(m(xs), ref(xs), rtol=2e-3, atol=2e-3)
    graphs = m.graphs["forward"]
    assert m.graph_status()["forward"] == "graph", m.graph_status()
    assert sorted(k[0][1] for k in graphs.sizes) == [2, 17, 200], graphs.sizes


# ------------------------------------------------------------------------------- roofline

def roofline(arch: str, out: Path) -> list[dict]:
    """Achieved memory bandwidth of single fused kernels on large tensors, as a fraction of
    this GPU's device-to-device copy bandwidth measured in the same run (the practical roof)."""
    from aotc.api import compile_function
    n = 1 << 26
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    dst = torch.empty_like(a)
    copy_ms = median_ms(lambda: dst.copy_(a), runs=30)
    roof = 2 * a.nbytes / copy_ms / 1e6    # GB/s: read + write
    cases = {
        "pointwise silu(a)*b+a": (lambda a, b: F_silu(a) * b + a, (a, b), 3),
        "softmax 16384x4096": (lambda x: torch.softmax(x, -1),
                               (a[:16384 * 4096].view(16384, 4096),), 2),
        "layer_norm 16384x4096": (lambda x: torch.nn.functional.layer_norm(x, (4096,)),
                                  (a[:16384 * 4096].view(16384, 4096),), 2),
        "sum rows 16384x4096": (lambda x: x.sum(-1), (a[:16384 * 4096].view(16384, 4096),), 1),
    }
    rows = [dict(case=f"roof: device copy {roof:.0f} GB/s", ok=True)]
    for name, (fn, args, passes) in cases.items():
        try:
            p = compile_function(fn, tuple(t.cpu() for t in args), out / f"roof_{len(rows)}.aotc",
                                 target=f"cuda:{arch}", record_samples=False)
            m = aotc.load(p, cuda_graph=False)
            ms = median_ms(lambda: m(*args), runs=30)
            eager_ms = median_ms(lambda: fn(*args), runs=30)
            nbytes = passes * args[0].nbytes
            gbs = nbytes / ms / 1e6
            rows.append(dict(case=f"roof: {name}", ok=True,
                             note=f"{gbs:.0f} GB/s = {gbs / roof:.0%} of copy "
                                  f"(aotc {ms:.3f} ms, eager {eager_ms:.3f} ms)"))
        except Exception as e:
            rows.append(dict(case=f"roof: {name}", ok=False, note=f"{type(e).__name__}: {e}"[:200]))
    return rows


def F_silu(x):
    return torch.nn.functional.silu(x)


# -------------------------------------------------------------------------------- reporting

def print_table(rows: list[dict]) -> None:
    head = (f"{'case':48} {'ok':4} {'max abs':>9} {'max rel':>9} {'kern':>4} {'export s':>8} "
            f"{'load s':>7} {'eager ms':>8} {'aotc ms':>8} {'no graph':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "abs" not in r:
            print(f"{r['case']:48} {'ok' if r['ok'] else 'FAIL':4} {r.get('note', '')}")
            continue
        print(f"{r['case'][:48]:48} {'ok' if r['ok'] else 'FAIL':4} {r['abs']:9.2e} "
              f"{r['rel']:9.2e} {r['kernels']:4d} {r['export_s']:8.1f} {r['load_s']:7.3f} "
              f"{r['eager_ms']:8.3f} {r['aotc_ms']:8.3f} {r.get('plain_ms', float('nan')):8.3f}")


def cross_build(out: Path, arch: str) -> None:
    """On a machine without a GPU: export samples for `arch` to carry to a GPU machine."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("mlp", "transformer", "cnn"):
        build, make_inputs = MODELS[name]
        torch.manual_seed(0)
        p = aotc.export(build().eval(), make_inputs(), out / f"{name}_{arch}.aotc",
                        target=f"cuda:{arch}")
        print(p)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", help="GPU arch to compile for (default: this GPU's)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated, or `all`: these and every benchmark-suite model")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--prebuilt", nargs="*", default=[], type=Path,
                    help="artifacts built elsewhere (e.g. on a machine without a GPU) to run")
    ap.add_argument("--cross-build", type=Path, help="export artifacts into this folder and stop")
    ap.add_argument("--out", type=Path, help="where to write artifacts (default: a temp dir)")
    ap.add_argument("--no-roofline", action="store_true",
                    help="skip the memory-bandwidth measurement of single fused kernels")
    args = ap.parse_args(argv)
    if args.cross_build:
        cross_build(args.cross_build, args.arch or "sm_90")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA GPU visible to torch; use --cross-build on this machine", file=sys.stderr)
        return 2
    major, minor = torch.cuda.get_device_capability()
    arch = args.arch or f"sm_{major}{minor}"
    import triton
    print(f"GPU {torch.cuda.get_device_name()} (sm_{major}{minor}); torch {torch.__version__}, "
          f"triton {triton.__version__}, aotc {aotc.__version__}; compiling for {arch}\n")
    out = args.out or Path(tempfile.mkdtemp(prefix="aotc-gpu-check-"))
    rows = []
    if args.models == "all":
        MODELS.update(suite_models())
        args.models = ",".join(MODELS)
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            try:
                rows.append(check_model(name, dtype, arch, out))
            except Exception as e:
                traceback.print_exc()
                rows.append(dict(case=f"{name} {dtype}", ok=False,
                                 note=f"{type(e).__name__}: {e}"[:200]))
    for p in args.prebuilt:
        try:
            rows.append(check_prebuilt(p))
        except Exception as e:
            traceback.print_exc()
            rows.append(dict(case=f"prebuilt {p.name}", ok=False,
                             note=f"{type(e).__name__}: {e}"[:200]))
    rows += runtime_checks(arch, out)
    if not args.no_roofline:
        rows += roofline(arch, out)
    print_table(rows)
    failed = [r["case"] for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} ok" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
