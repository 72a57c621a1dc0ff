"""Generation across transformers decoder families: each family of
benchmarks/generate_families.py exported with `decode=True` on the CPU, its greedy tokens held
to transformers' own `generate` with a static cache, and the refusals held to their reasons.

    python -m benchmarks.generate_zoo --out benchmarks/results/cpu-generate-zoo
    python -m benchmarks.generate_zoo --families gemma2,mistral_window --new-tokens 64

Per family: the status ("match": every token equal; "diverged": the first differing step;
"refused": an aotc error, with "expected" saying whether it is the documented refusal), aotc's
export time and the error's first line. results.json records the command and the commit.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.generate_families import FAMILIES, MATCH, build, reference
from benchmarks.run import commit

OUT = Path(__file__).resolve().parent / "results" / "cpu-generate-zoo"


def check(name: str, new_tokens: int, cache: int, runner: str | None = None) -> dict:
    """One family's record (see the module doc)."""
    import aotc
    expected = FAMILIES[name][3]
    m = build(name)
    ids = torch.randint(1, 500, (2, 7), generator=torch.Generator().manual_seed(2))
    rec = {"family": name, "class": type(m).__name__, "expected": expected}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = aotc.export(m, (ids,), Path(tmp) / "m.aotc", decode=True, max_cache_len=cache)
            rec["export_s"] = round(time.perf_counter() - start, 2)
            got = aotc.load(path, runner=runner).generate(ids, new_tokens)
        except aotc.AotcError as e:
            first = str(e).splitlines()[0]
            return dict(rec, status="refused", error=f"{type(e).__name__}: {first}",
                        as_expected=expected != MATCH and first.startswith(expected))
    want = reference(m, ids, new_tokens)
    differ = (got != want).any(0).nonzero()
    if not len(differ):
        return dict(rec, status="match", as_expected=expected == MATCH)
    return dict(rec, status="diverged", first_divergence=int(differ[0]) - ids.shape[1],
                as_expected=False)


def report(records: list[dict]) -> str:
    rows = ["| family | model | status | export s | as documented | note |",
            "|---|---|---|---:|---|---|"]
    for r in records:
        note = r.get("error", "") or (f"first divergence at step {r['first_divergence']}"
                                      if "first_divergence" in r else "")
        rows.append(f"| {r['family']} | {r['class']} | {r['status']} | {r.get('export_s', '-')} "
                    f"| {'yes' if r['as_expected'] else 'NO'} | {note} |")
    matched = sum(r["status"] == "match" for r in records)
    ok = sum(r["as_expected"] for r in records)
    return "\n".join(rows + ["", f"{matched} of {len(records)} families generate transformers' "
                                 f"tokens; {ok} of {len(records)} as documented"]) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.generate_zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", type=lambda s: s.split(","), default=list(FAMILIES))
    p.add_argument("--new-tokens", type=int, default=40)
    p.add_argument("--cache", type=int, default=96)
    p.add_argument("--runner", choices=("cpp", "python"), default=None)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        p.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    sha, dirty = commit()          # what is measured: the tree as the run starts
    records = []
    for name in args.families:
        records.append(check(name, args.new_tokens, args.cache, args.runner))
        print(json.dumps(records[-1]), flush=True)
    meta = {"command": "python -m benchmarks.generate_zoo " + " ".join(argv or sys.argv[1:]),
            "commit": sha, "clean_tree": not dirty, "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "new_tokens": args.new_tokens, "cache": args.cache}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "records": records},
                                                      indent=1) + "\n")
    (args.out / "results.md").write_text(report(records))
    print(report(records))
    return 0 if all(r["as_expected"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
