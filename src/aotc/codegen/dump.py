"""`--dump-passes DIR`: each codegen pass's output, readable, as the pass makes it.

    DIR/passes.txt                 the pass list: number, name, input -> output, seconds
    DIR/<entry>/NN-<pass>.txt      an entry's graph, loop IR, kernels, plan after pass NN
    DIR/NN-<pass>.txt              what one pass makes for the whole artifact (the stored
                                   weights, the built files, the manifest)

Numbers are positions in the pass list (codegen/passes.py), so a pass that did not run leaves
its number out of the entries' files (passes.txt says why). Files are written after each
pass, so an export that fails leaves the passes before the failure.
"""
from __future__ import annotations

import json
from pathlib import Path

from aotc.codegen import printer
from aotc.codegen import stages as st
from aotc.errors import UsageError


class Dumper:
    def __init__(self, root: Path, passes: tuple):
        if root.exists() and not root.is_dir():
            raise UsageError(f"--dump-passes {root} is not a folder", where="--dump-passes",
                             expected="a folder (created if missing)", found="a file",
                             fix="name a folder for the pass dumps")
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.passes = root, passes
        self.rows = [f"{n:02d} {p.name:<9} {p.input.__name__} -> {p.output.__name__}: {p.doc}"
                     for n, p in enumerate(passes, 1)]

    def skipped(self, number: int, p) -> None:
        self.rows[number - 1] += f"  (skipped: {p.when.__doc__ or 'not needed here'})"
        self._index()

    def write(self, number: int, p, value, seconds: float) -> None:
        for scope, text in stage_texts(value).items():
            folder = self.root / scope if scope else self.root
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{number:02d}-{p.name}.txt").write_text(text)
        self.rows[number - 1] += f"  ({seconds:.3f} s)"
        self._index()

    def _index(self) -> None:
        (self.root / "passes.txt").write_text("\n".join(self.rows) + "\n")


def stage_texts(value) -> dict[str, str]:
    """{entry name (or "" for the whole artifact): text} for a stage value."""
    if isinstance(value, st.Graphs):
        head = (f"weights read transposed: {', '.join(value.flipped)}\n\n"
                if value.flipped else "")
        return {n: head + printer.graph_text(g) for n, g in value.graphs.items()}
    if isinstance(value, st.Lowered):
        return {n: printer.lowered_text(low) for n, low in value.entries.items()}
    if isinstance(value, st.Scheduled):
        return {n: printer.scheduled_text(e.steps, e.decisions)
                for n, e in value.entries.items()}
    if isinstance(value, st.Weighted):
        return {"": weights_text(value.weights)}
    if isinstance(value, st.Generated):
        return {n: kernels_text(e.kernels, value.kernels) for n, e in value.entries.items()}
    if isinstance(value, st.Planned):
        return {n: printer.plan_text(p.to_json()) for n, p in value.plans.items()}
    if isinstance(value, st.Built):
        return {"": built_text(value)}
    if isinstance(value, st.Artifact):
        return {"": f"{value.path}\n\n" + (Path(value.path) / "manifest.json").read_text()}
    return {"": repr(value) + "\n"}


def weights_text(w: st.StoredWeights) -> str:
    lines = [f"{len(w.weights)} stored, {len(w.aliases)} tied"]
    for name, t in w.weights.items():
        how = " (stored transposed)" if name in w.transposed else ""
        lines.append(f"  {name}: {str(t.dtype).removeprefix('torch.')}{list(t.shape)}{how}")
    lines += [f"  {name} -> {target} (tied)" for name, target in sorted(w.aliases.items())]
    return "\n".join(lines) + "\n"


def kernels_text(kernels: list, generated) -> str:
    """Each kernel of an entry: its signature (buffers read and written, size arguments,
    launch) and its source as the backend wrote it."""
    if not kernels:
        return "no kernels\n"
    out = []
    for k in kernels:
        ins, outs, sizes, launch = generated.signatures[k.name]
        head = (f"kernel {k.name}: reads {', '.join(ins) or '-'}; writes "
                f"{', '.join(outs)}; sizes {printer.dims_text(sizes)}")
        if launch is not None:
            head += f"; launch {json.dumps(launch.to_json(), sort_keys=True)}"
        out.append(f"{head}\n\n{generated.texts[k.name].rstrip()}\n")
    return "\n\n".join(out)


def built_text(built: st.Built) -> str:
    lines = ["files:"] + [f"  {rel}: {len(data)} bytes"
                          for rel, data in sorted(built.files.items())]
    native = json.dumps(built.native, indent=1, sort_keys=True) if built.native else "none"
    return "\n".join(lines) + f"\n\nnative: {native}\n"
