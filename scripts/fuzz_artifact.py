"""Mutate artifacts as a hostile producer could and report every failure that is not typed.

    python scripts/fuzz_artifact.py ARTIFACT [--cases N] [--seed S] [--interpret]

Each case copies ARTIFACT, changes one JSON value of its manifest, plans, runner files or, in a
CUDA artifact, kernel launch specs (a
number moved, a string swapped, a list item dropped or repeated, a key deleted), recomputes
the hashes, then loads the copy with one of the runners and runs it (a generator: `generate`
and `stream`; a training artifact: forward on random inputs, then backward from the sum of
its outputs; else a call on random inputs of the entry's shapes) in a child process
(`--interpret`: a CUDA artifact on the CPU, its kernels run by Triton's interpreter, with the
Python runner). Typed
errors (AotcError) and clean runs pass; anything else is printed as FINDING with the mutation,
and a child killed by a signal (a crash) or running past 60 s as CRASH. Exit status 1 if any.
The parent only edits files: the children start from a process that has run no ATen op.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from hostile import rehash, write_manifest  # noqa: E402

STRINGS = ["", "float64", "int32", "state", "weight", "value", "input", "kernel", "view",
           "extern", "aten::mm.default", "1", "../x"]


def _values(doc, path=()):
    """Every (path, value) of a JSON document, containers included."""
    yield path, doc
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) \
        if isinstance(doc, list) else ()
    for k, v in items:
        yield from _values(v, path + (k,))


def mutate(value, rng: random.Random):
    """One hostile change of a JSON value."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, value * 2, -value, 0, -1, 1 << 31, 1 << 62])
    if isinstance(value, float):
        return rng.choice([value * 2, -value, 0.0, 1e30, float("nan"), int(value)])
    if isinstance(value, str):
        return rng.choice([value + "x", value.upper(), *STRINGS])
    if isinstance(value, list):
        out = list(value)
        if out and rng.random() < 0.5:
            del out[rng.randrange(len(out))]
        else:
            out.insert(rng.randrange(len(out) + 1), out[rng.randrange(len(out))] if out else 0)
        return out
    if isinstance(value, dict):
        out = dict(value)
        if out:
            del out[rng.choice(list(out))]
        return out
    return rng.choice([0, "x", [], {}])


def _set(doc, path, value):
    if not path:
        return value
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


def _exercise(art: Path, runner: str) -> None:
    """Load and run `art` (in the child); runner "interpret": a CUDA artifact on the CPU."""
    import torch
    import aotc
    m = aotc.load(art, device="cpu", interpret=True) if runner == "interpret" else \
        aotc.load(art, runner=runner)
    gen = getattr(m, "generation", None)
    if gen is not None:
        ids = torch.randint(0, gen.vocab, (gen.batch, 5))
        m.generate(ids, 4)
        list(m.stream(ids, 2))
    elif getattr(m, "manifest", None) is not None and m.manifest.training is not None:
        outs = [t for t in _tensors(m(*m.random_inputs())) if t.requires_grad]
        if outs:   # the backward plan too
            sum(t.float().sum() for t in outs).backward()
    else:
        m(*m.random_inputs())


def _tensors(value) -> list:
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value \
        if isinstance(value, (list, tuple)) else ()
    return [t for v in items for t in _tensors(v)]


def _child(art: Path, runner: str, desc: str) -> None:
    from aotc.errors import AotcError
    signal.alarm(60)
    code = 0
    try:
        _exercise(art, runner)
    except AotcError:
        pass
    except BaseException as e:   # noqa: BLE001 - what the campaign looks for
        tb = traceback.extract_tb(e.__traceback__)[-2:]
        at = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in tb[::-1])
        print(f"FINDING {desc} runner={runner}: {type(e).__name__}: {str(e)[:300]} at {at}",
              flush=True)
        code = 3
    sys.stdout.flush()
    os._exit(code)


def case(src: Path, work: Path, rng: random.Random, interpret: bool = False) -> bool:
    """One mutated copy of `src`, run in a child; True if it found something."""
    art = work / "a.aotc"
    shutil.rmtree(art, ignore_errors=True)
    shutil.copytree(src, art)
    files = ["manifest.json", *(str(p.relative_to(src)) for p in sorted(src.glob("plans/*.json"))),
             *(str(p.relative_to(src)) for p in sorted(src.glob("runner/*.json"))),
             *(str(p.relative_to(src)) for p in sorted(src.glob("kernels/*.json")))]
    rel = rng.choice(files)
    doc = json.loads((art / rel).read_bytes())
    path, old = rng.choice(list(_values(doc)))
    new = mutate(old, rng)
    doc = _set(doc, path, new)
    if rel == "manifest.json":
        write_manifest(art, doc)
    else:
        (art / rel).write_bytes(json.dumps(doc).encode())
        rehash(art)
    desc = f"{rel} {list(path)}: {str(old)[:60]!r} -> {str(new)[:60]!r}"
    runner = "interpret" if interpret else rng.choice(["cpp", "python"])
    pid = os.fork()
    if pid == 0:
        _child(art, runner, desc)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        print(f"CRASH signal {os.WTERMSIG(status)} {desc} runner={runner}", flush=True)
        return True
    return os.WEXITSTATUS(status) != 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interpret", action="store_true",
                    help="a CUDA artifact, run on the CPU by Triton's interpreter")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        found = sum(case(args.artifact, Path(tmp), rng, args.interpret)
                    for _ in range(args.cases))
    print(f"{args.cases} cases, {found} findings", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
