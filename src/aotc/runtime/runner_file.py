"""Runner files (format >= 10; of CUDA artifacts from 14): each entry's C++ runner spec as data.

The C++ front end (runtime/cpp/frontend, `aotc::Module`) runs artifacts with no Python, so it
cannot run the schema's parser and checks. Export therefore writes, per entry, what the Python
front end hands the C++ runner at load (runtime/cpp_runner.py `_Spec.as_dict()` and
`guard_spec`), as one flat JSON document, `runner/<entry>.json`, listed and hashed in the
manifest like every file:
  - the plan's steps as the runner takes them: slots by number, sizes as postfix bytecode, ATen
    ops by name with tagged arguments, kernels by name and signature (argument count, size
    count, pointer dtypes) instead of an address: the loader finds each in the library's own
    table and checks the signature there; a CUDA artifact's kernel step (format >= 14) adds
    [grid, error code]: its grid's three dims and the code it flags an index out of range with
    (0: none), checked against the kernel's launch spec, whose cubin the loader loads (from
    format 19 [grid, error code, extents]: the elements the kernel indexes past each pointer,
    its launch spec's, which the runner checks each call's tensors against); a
    call that binds value-dependent sizes (format >= 16) adds [[symbol, result, dim or -1,
    lo, hi], ...]; `symbols` lists the inputs' symbols, then those the calls bind, in plan
    order (the guards' `plan_symbols` give the former);
  - the constants by name: a weight slot names its stored tensor (tied names resolved), its
    stored dtype and shape and the load-time transform (`transpose`, `channels_last`); a state
    slot names its state, allocated with zeros;
  - the guards as the C++ guards take them, plus the texts their error messages quote
    (input names, shape specs, expressions), so a failed guard raises the message Python's
    runtime/guards.py would.
The C++ loader validates the document completely before building anything (every index in
range, every tag and dtype from a fixed table, every kernel against the table, every weight
against its safetensors header, every size bounded), then the runner checks the spec again.

One plan: a runner file is a pure function of its entry's typed plan and the manifest
(`runner_files`, deterministic byte for byte: canonical JSON, kwargs in name order), used at
export and again when Python reads the plans (`check_runner_files`, from Artifact.plans): a
stored runner file that is not what its plan derives is refused, so the C++ front end cannot be
made to compute what `aotc verify` and `aotc.load` did not check. Documents are compared as
JSON values (formatting and key order compute nothing; JSON types do). Older exports are held
to the derivation of their version: formats 10-12 wrote a kernel argument's first four fields
(the C++ front end refuses those kernel steps); exports of format 14 and before may predate
load-time folding of calls and kernels (only views of weights folded: `folding=False`); and
before the kwargs were put in name order an ATen call's kwargs came in the order codegen built
them (compared here in name order: the C++ runner binds kwargs by name and refuses a name
twice, so their order computes nothing).
"""
from __future__ import annotations

import dataclasses
import json
import math

import torch

from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from aotc.runtime.cpp_runner import _collectives, _Spec, guard_spec
from aotc.runtime.executor import load_transform
from aotc.runtime.guards import Guards
from aotc.runtime.kernels import launch_specs
from aotc.artifact.schema import load_json
from aotc.artifact.schema.plan import with_ranges
from aotc.artifact.schema.rules import RUNNER_MISMATCH, fill
from aotc.artifact.schema.types import SlotKind


class _Table:
    """Stands in for a loaded kernel library: a kernel's 'address' is its signature."""
    set_threads_address = 1

    @staticmethod
    def kernel_address(name: str, nargs: int, nsizes: int, dtypes: list[str]) -> list:
        return [nargs, nsizes, ",".join(dtypes)]


class _Launches:
    """Stands in for a CUDA artifact's kernels: a kernel's launcher is its signature (the C++
    front end loads the cubin its launch spec names and checks the signature against it);
    `specs`: kernel name -> its launch spec (for its extents)."""

    def __init__(self, specs: dict):
        self.specs = specs

    def spec(self, name: str):
        return self.specs[name]

    @staticmethod
    def runner_launcher(name: str, nargs: int, nsizes: int, dtypes: list[str]) -> list:
        return [nargs, nsizes, ",".join(dtypes)]


class _NamedSpec(_Spec):
    """A `_Spec` whose constants are names, not tensors (the C++ loader binds them)."""

    def bind(self, weights: dict, state: dict) -> None:
        self.constants = []


class _UnfoldedSpec(_NamedSpec):
    """The spec as exported before calls and kernels were folded at load (views only;
    formats before FOLDING_SINCE)."""
    folding = False


RUNNER_SINCE = 10        # the first format with runner files (C++: frontend/files.h)
CUDA_RUNNER_SINCE = 14   # the first whose CUDA artifacts have them
KERNEL_ARGS_SINCE = 13   # kernel arguments as [slot, lay out, contiguous, strides, shape, dtype]
FOLDING_SINCE = 15       # load-time folding came during format 14: its exports have it or not


def runner_files(manifest, plans: dict, read=None) -> dict[str, bytes]:
    """{runner file: bytes} for each entry of an artifact the C++ runner runs (none for
    tensor-parallel artifacts, nor before their format had them), in the form of the
    manifest's format version; `plans`: entry -> typed plan; `read`: artifact-relative path
    -> bytes, for a CUDA artifact's launch specs."""
    return {rel: fmt.dumps(doc) for rel, doc in runner_documents(manifest, plans, read).items()}


def runner_documents(manifest, plans: dict, read=None, *, folding: bool = True) -> dict:
    """{runner file: its JSON document} (see runner_files); `folding=False`: as exported
    before calls and kernels were folded at load (see the module doc)."""
    device = torch.device(manifest.target.device.value)
    version = manifest.format_version
    if version < (RUNNER_SINCE if device.type == "cpu" else CUDA_RUNNER_SINCE) or \
            manifest.tensor_parallel is not None or any(_collectives(p) for p in plans.values()):
        return {}
    native = manifest.target.native
    lib = None if native is None else _Table() if device.type == "cpu" else \
        _Launches(launch_specs(manifest, native.kernels, read, manifest.format_version))
    aliases = manifest.weights.aliases
    make = _NamedSpec if folding else _UnfoldedSpec
    return {fmt.runner_file(name): document(plans[name], spec, lib, aliases, device, version,
                                            make)
            for name, spec in manifest.entries.items()}


def document(plan, entry, library, aliases: dict, device: torch.device,
             version: int = fmt.FORMAT_VERSION, make=_NamedSpec) -> dict:
    """The runner file of one entry in the form of format `version` (see the module doc)."""
    plan = dataclasses.replace(plan, steps=tuple(with_ranges(s, entry.symbols)
                                                 for s in plan.steps))
    spec = make(plan, {}, device, library, True, {})
    doc = spec.as_dict()
    guards = Guards(entry.inputs, entry.symbols, entry.relations)
    gspec = guard_spec(guards, spec.given, device)
    steps = [_step(s, version) for s in doc["steps"]]
    return {"entry": plan.entry, "slots": doc["slots"], "symbols": spec.symbols,
            "exprs": doc["exprs"], "inputs": doc["inputs"], "steps": steps,
            "outputs": [[slot, _tagged(spec._arg(const))] for slot, const in doc["outputs"]],
            "weights": _weights(plan, aliases), "state": _state(plan),
            "set_threads": isinstance(library, _Table), "guards": gspec}


def _step(step: tuple, version: int) -> list:
    if step[0] == "call":   # format 16: [symbol, result, dim or -1, lo, hi] per bound size
        kind, idx, op, overload, args, kwargs, out, single, fold, *binds = step
        return [kind, idx, op, overload, [_tagged(a) for a in args],
                [[k, _tagged(v)] for k, v in kwargs], out, single, fold,
                *([[list(b) for b in binds[0]]] if binds else [])]
    out = [list(x) if isinstance(x, tuple) else x for x in step[:7]]
    if step[0] == "kernel" and version < KERNEL_ARGS_SINCE:   # [slot, lay out, contiguous,
        out[4] = [list(a[:4]) for a in out[4]]                # strides] (see the module doc)
    if step[0] == "kernel" and len(step) == 8:   # a Triton kernel: its signature where a C++
        signature, *launch = step[7]             # kernel's is, then its launch
        out[3] = signature
        out.append(list(launch))
    return out


def _tagged(a: tuple) -> list:
    """A tagged argument as JSON: non-finite floats as the strings inf, -inf, nan."""
    tag, *rest = a
    if tag == "list":
        return [tag, [_tagged(x) for x in rest[0]]]
    if tag == "f" and not math.isfinite(rest[0]):
        return [tag, str(rest[0])]
    return [tag, *rest]


def _weights(plan, aliases: dict) -> list:
    """Per weight slot: [slot, stored name, stored dtype, stored shape, transform]."""
    out = []
    for i, s in enumerate(plan.slots):
        if s.kind is not SlotKind.WEIGHT:
            continue
        transform = load_transform(s)
        shape = list(s.shape)[::-1] if transform == "transpose" else list(s.shape)
        shape = [d if isinstance(d, int) else -1 for d in shape]   # -1: not checked
        out.append([i, aliases.get(s.weight, s.weight), s.dtype, shape, transform])
    return out


def _state(plan) -> list:
    """Per state slot: [slot, state name, dtype, shape] (zeros at load, shared by entries)."""
    return [[i, s.state, s.dtype, list(s.shape)] for i, s in enumerate(plan.slots)
            if s.kind is SlotKind.STATE]


# ------------------------------------------------------------------------------ the check
def checked_plans(art) -> dict:
    """Every entry's plan (entry -> Plan), the runner files checked against them: a stored
    runner file that is not what its plan derives is refused, so the C++ front end runs what
    was checked here."""
    plans = art.plans()
    check_runner_files(art, plans)
    return plans


def check_runner_files(art, plans: dict) -> None:
    """Refuse an artifact whose runner files are not what its typed plans derive (a file
    missing, one too many, or another document; see the module doc). `art`: an opened
    Artifact; `plans`: entry -> its plan, as Artifact.plan parsed and checked it. Documents
    are compared as compact canonical JSON (the same values of the same JSON types, lists in
    the same order), which json's C encoder writes quickly (the indented form export writes
    would take the pure-Python encoder, ~30 ms on BERT-base)."""
    derived = runner_documents(art.manifest, plans, art.read)
    stored = {rel for rel in art.manifest.files if rel.startswith(fmt.RUNNER_DIR + "/")}
    entries = {fmt.runner_file(name): fmt.plan_file(name) for name in art.manifest.entries}
    unfolded = None
    for rel in sorted(stored | set(derived)):
        if rel not in stored or rel not in derived:
            found = "no runner file" if rel in derived else "a runner file no plan derives"
        else:
            got = load_json(art.read(rel), rel).value
            if _compact(got) == _compact(derived[rel]):
                continue
            got = _named_kwargs(got)
            found = _difference(_plain(derived[rel]), got)
            if found is not None and art.manifest.format_version < FOLDING_SINCE:
                if unfolded is None:
                    unfolded = runner_documents(art.manifest, plans, art.read, folding=False)
                found = found if _difference(_plain(unfolded[rel]), got) else None
            if found is None:
                continue
        raise ArtifactError(**fill(RUNNER_MISMATCH, file=rel, plan=entries.get(rel, "plans/"),
                                   found=found))


def _compact(doc) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _plain(doc):
    """A document as JSON reads it back (tuples as lists)."""
    return json.loads(_compact(doc))


def _named_kwargs(doc):
    """A stored runner file with each call's kwargs in name order (an older export's order;
    see the module doc)."""
    if isinstance(doc, dict) and isinstance(doc.get("steps"), list):
        for s in doc["steps"]:
            if isinstance(s, list) and len(s) > 5 and s[0] == "call" and isinstance(s[5], list):
                s[5] = sorted(s[5], key=lambda kv: json.dumps(kv, sort_keys=True))
    return doc


def _difference(want, got, where: str = "") -> str | None:
    """Where `got` first differs from `want` (JSON values), or None where they are equal."""
    if type(want) is not type(got) or not isinstance(want, (dict, list)):
        return None if want == got and type(want) is type(got) else \
            f"at {where or 'the top'}: {_short(got)} where the plan derives {_short(want)}"
    if isinstance(want, dict):
        for k in sorted(set(want) | set(got)):
            at = f"{where}.{k}" if where else k
            if k not in want or k not in got:
                return f"at {at}: " + ("a field the plan does not derive" if k in got
                                       else "missing")
            if (d := _difference(want[k], got[k], at)) is not None:
                return d
        return None
    for i, (w, g) in enumerate(zip(want, got)):
        if (d := _difference(w, g, f"{where}[{i}]")) is not None:
            return d
    if len(want) != len(got):
        return f"at {where or 'the top'}: {len(got)} items where the plan derives {len(want)}"
    return None


def _short(v) -> str:
    text = json.dumps(v, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
