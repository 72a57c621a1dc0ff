"""Export a suite's aotc artifacts ahead of the benchmark, several at once, so exports (and
cross-compilation) overlap with the other systems' measurements.

    python -m benchmarks.prebuild --suite gpu-set --dtype bf16 --target cuda:sm_90 --jobs 4 \\
        --out OUT/prebuilt &
    python -m benchmarks.run --suite gpu-set --device cuda --dtype bf16 --prebuilt OUT/prebuilt

Each point's model and inputs are built as the harness builds them (seeded, cast to the run
dtype), on the CPU in a worker process that sees no GPU, and exported for `--target`. The
artifact goes to OUT/KEY.aotc, then OUT/KEY.json records the export's seconds or its error;
the benchmark's `aotc` system (systems.Aotc with `prebuilt`) waits for that file, under the
harness's build limit, and loads the artifact. KEY (`systems.point_key`) is a digest of the
model's class, parameter count and the inputs' shapes and dtypes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from benchmarks import harness, models


def export_point(name: str, size: str, point: str, dtype: str, target: str, out: Path) -> str:
    """Export one point's artifact (in a worker process); returns a line saying how it went."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    import aotc
    from benchmarks.systems import point_key
    spec = next(s for s in models.REGISTRY if s.name == name)
    model, inputs = spec.make(size, point)
    model = model.to(dtype=harness.DTYPES[dtype])
    inputs = harness.cast(inputs, torch.device("cpu"), harness.DTYPES[dtype])
    key = point_key(model, inputs)
    record = {"model": name, "point": point, "target": target}
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            aotc.export(model, inputs, out / f"{key}.aotc", target=target)
        record["export_s"] = time.perf_counter() - t0
    except Exception as e:   # the benchmark reports it as this point's export failure
        record["error"] = harness.describe(e)
    (out / f"{key}.json.part").write_text(json.dumps(record))
    (out / f"{key}.json.part").rename(out / f"{key}.json")
    return f"{name} / {point}: " + (f"{record['export_s']:.1f} s" if "export_s" in record
                                    else record["error"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prebuild", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="gpu-set", choices=tuple(models.SUITES))
    p.add_argument("--models", default=None, help="comma-separated (default: the suite's)")
    p.add_argument("--points", default=",".join(models.POINTS))
    p.add_argument("--dtype", default="fp32", choices=tuple(harness.DTYPES))
    p.add_argument("--target", default="cpu", help="aotc target, e.g. cuda:sm_90")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    size, specs = models.select(args.suite, args.models and args.models.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    todo = [(s.name, pt) for s in specs if s.available() is None
            for pt in args.points.split(",")]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(export_point, n, size, pt, args.dtype, args.target, args.out)
                   for n, pt in todo]
        for f in as_completed(futures):
            print(f"[{time.perf_counter() - start:6.1f}s] prebuilt {f.result()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
