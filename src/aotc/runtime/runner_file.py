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
Python's loader only checks the file's hash; `aotc inspect` lists it.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from aotc.runtime import format as fmt
from aotc.runtime.cpp_runner import _collectives, _Spec, guard_spec
from aotc.runtime.executor import load_transform
from aotc.runtime.guards import Guards
from aotc.runtime.kernels import launch_specs
from aotc.runtime.schema.plan import with_ranges
from aotc.runtime.schema.types import SlotKind


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


def runner_files(manifest, plans: dict, read=None) -> dict[str, bytes]:
    """{runner file: bytes} for each entry of an artifact the C++ runner runs (none for
    tensor-parallel artifacts); `plans`: entry -> typed plan; `read`: artifact-relative path
    -> bytes, for a CUDA artifact's launch specs."""
    if manifest.tensor_parallel is not None or any(_collectives(p) for p in plans.values()):
        return {}
    device = torch.device(manifest.target.device.value)
    native = manifest.target.native
    lib = None if native is None else _Table() if device.type == "cpu" else \
        _Launches(launch_specs(manifest, native.kernels, read, manifest.format_version))
    aliases = manifest.weights.aliases
    return {fmt.runner_file(name): fmt.dumps(document(plans[name], spec, lib, aliases, device))
            for name, spec in manifest.entries.items()}


def document(plan, entry, library, aliases: dict, device: torch.device) -> dict:
    """The runner file of one entry (see the module doc)."""
    plan = dataclasses.replace(plan, steps=tuple(with_ranges(s, entry.symbols)
                                                 for s in plan.steps))
    spec = _NamedSpec(plan, {}, device, library, True, {})
    doc = spec.as_dict()
    guards = Guards(entry.inputs, entry.symbols, entry.relations)
    gspec = guard_spec(guards, spec.given, device)
    steps = [_step(s) for s in doc["steps"]]
    return {"entry": plan.entry, "slots": doc["slots"], "symbols": spec.symbols,
            "exprs": doc["exprs"], "inputs": doc["inputs"], "steps": steps,
            "outputs": [[slot, _tagged(spec._arg(const))] for slot, const in doc["outputs"]],
            "weights": _weights(plan, aliases), "state": _state(plan),
            "set_threads": isinstance(library, _Table), "guards": gspec}


def _step(step: tuple) -> list:
    if step[0] == "call":   # format 16: [symbol, result, dim or -1, lo, hi] per bound size
        kind, idx, op, overload, args, kwargs, out, single, fold, *binds = step
        return [kind, idx, op, overload, [_tagged(a) for a in args],
                [[k, _tagged(v)] for k, v in kwargs], out, single, fold,
                *([[list(b) for b in binds[0]]] if binds else [])]
    out = [list(x) if isinstance(x, tuple) else x for x in step[:7]]
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
