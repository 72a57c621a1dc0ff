"""What checking runner files against their plans costs a load (issue 45 item 3, one plan):
BERT-base (samples/hf_models.py:bert, full=True, random weights, fp32 on the CPU) exported once,
then `aotc.load` timed with a baseline tree's aotc (e.g. main's), with this tree's, and with
this tree's where the check is replaced by nothing ("unchecked": what the check costs a load),
each load in a fresh process, alternating, `--reps` times each (medians), from a warm page
cache. The check alone (runtime/runner_file.py check_runner_files) is timed in this tree too.

    python -m benchmarks.runner_check --baseline /work/main/src --reps 7
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"

LOAD = """
import sys, time, torch
torch.set_num_threads(1)
import aotc
if sys.argv[2] == "unchecked":   # this tree with the check replaced by nothing (its net cost)
    import aotc.runtime.runner_file as rf
    rf.check_runner_files = lambda art, plans: None
t = time.perf_counter(); m = aotc.load(sys.argv[1]); dt = time.perf_counter() - t
print(dt, m.runtime)
"""

CHECK = """
import sys, time
from aotc.artifact.reader import Artifact
from aotc.runtime.runner_file import check_runner_files
art = Artifact(sys.argv[1])
plans = {n: art.plan(n) for n in art.manifest.entries}
ts = []
for _ in range(5):
    t = time.perf_counter(); check_runner_files(art, plans); ts.append(time.perf_counter() - t)
print(sorted(ts)[2])
"""


def _run(src: Path, script: str, *args) -> str:
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _export(dest: Path) -> None:
    script = ("import sys, torch; sys.path.insert(0, 'samples'); import hf_models, aotc\n"
              "m = hf_models.bert(full=True).eval()\n"
              "aotc.export(m, (torch.randint(0, 1000, (1, 32)),), sys.argv[1])")
    _run(HERE, script, dest)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, required=True, help="another aotc's src/ folder")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--artifact", type=Path, help="an exported BERT-base (else one is made)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        art = a.artifact or Path(tmp) / "bert.aotc"
        if a.artifact is None:
            _export(art)
        times: dict[str, list] = {"baseline": [], "this": [], "unchecked": []}
        for _ in range(a.reps):
            for name, src in (("baseline", a.baseline), ("this", HERE), ("unchecked", HERE)):
                times[name].append(float(_run(src, LOAD, art, name).split()[0]))
        check = float(_run(HERE, CHECK, art))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=HERE).stdout.strip()
    print(json.dumps({"commit": commit, "command": " ".join(sys.argv), "device": "cpu",
                      "reps": a.reps, "load_s_median": {k: statistics.median(v)
                                                        for k, v in times.items()},
                      "load_s": times, "check_runner_files_s": check}, indent=1))


if __name__ == "__main__":
    main()
