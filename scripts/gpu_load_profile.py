"""Where a fresh process's `aotc.load` and first token go on a GPU: a generator artifact is
exported once, then loaded and prefilled in a new Python process under cProfile (what a
serving host pays at start: imports, the driver, module loads, graph capture, the first call).
Three fresh processes timed, then one under cProfile (which doubles the load's time).

    python scripts/gpu_load_profile.py --model llama-small --out OUT
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import cProfile, io, pstats, sys, time
t0 = time.perf_counter()
prof = cProfile.Profile() if sys.argv[2] == "1" else None
if prof:
    prof.enable()
import torch
import aotc
import aotc.runtime.cuda
cubins = []
def timed(self, *args, _init=aotc.runtime.cuda.CudaKernels.__init__):
    t = time.perf_counter()
    _init(self, *args)
    cubins.append(time.perf_counter() - t)
aotc.runtime.cuda.CudaKernels.__init__ = timed
t1 = time.perf_counter()
torch.zeros(1, device="cuda")   # the CUDA context: any CUDA process pays it once
t2 = time.perf_counter()
m = aotc.load(sys.argv[1])
t3 = time.perf_counter()
ids = torch.randint(0, 1000, (1, 128), device="cuda")
token = m.prefill(ids).argmax(-1, keepdim=True)
torch.cuda.synchronize()
t4 = time.perf_counter()
m.decode(token)
torch.cuda.synchronize()
t5 = time.perf_counter()
if prof:
    prof.disable()
print(f"imports {1e3 * (t1 - t0):.0f} ms, CUDA context {1e3 * (t2 - t1):.0f} "
      f"ms, aotc.load {1e3 * (t3 - t2):.0f} ms (kernel table and cubin loads "
      f"{1e3 * sum(cubins):.0f} ms), first prefill {1e3 * (t4 - t3):.0f} ms, "
      f"first decode {1e3 * (t5 - t4):.0f} ms")
for key in ("cumulative", "tottime") if prof else ():
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(key).print_stats(30)
    print(out.getvalue())
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-small")
    p.add_argument("--cache", type=int, default=320)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    import torch

    from benchmarks.generate_models import build_model
    from benchmarks.generate_systems import Aotc
    model, _ = build_model(args.model, torch.device("cuda"), torch.bfloat16)
    prompt = torch.randint(0, 1000, (1, 128), device="cuda")
    with tempfile.TemporaryDirectory() as tmp:
        Aotc(model, 1, args.cache, prompt, Path(tmp) / "g.aotc")
        text = "".join(_child(Path(tmp) / "g.aotc", p) for p in ("0", "0", "0", "1"))
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "load_profile.txt").write_text(text + "\n")


def _child(path: Path, profiled: str) -> str:
    """One fresh process's timings (under cProfile if `profiled`, which inflates them)."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), profiled],
                          capture_output=True,
                          text=True, check=False)
    return done.stdout + done.stderr[-3000:]


if __name__ == "__main__":
    main()
