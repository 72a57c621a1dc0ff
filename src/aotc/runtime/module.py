"""CompiledModule: a loaded artifact, callable like the model it was exported from.

Each call checks the guards (on by default), binds symbolic sizes, runs the entry's compiled plan
and puts the flat outputs back into the model's own output structure. A CompiledModule holds no
per-call state, so several threads may call it at once (an entry that replays a CUDA graph
serialises its calls: the graph's buffers are shared; runtime/graphs.py).
"""
from __future__ import annotations

from typing import NoReturn

import torch

from aotc.errors import AotcError, ArtifactError, GuardError, TargetError
from aotc.artifact import format as fmt
from aotc.runtime.binding import bind_arguments, signature_parameters
from aotc.runtime.cpp_runner import plan_function
from aotc.runtime.executor import PlanFunction, step_bound
from aotc.runtime.graphs import MAX_GRAPHS, GraphedEntry
from aotc.runtime.guards import Guards
from aotc.artifact.schema.rules import PLAN_FAILED, fill
from aotc.runtime.native import NativeLibrary, select_level
from aotc.runtime.runner_file import checked_plans
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.manifest import CppNative, TritonNative
from aotc.runtime.loading import load_weights, start_weights
from aotc.artifact.trees import describe, unflatten
from aotc.artifact.weights import tensors


# what raise_plan_failure takes (OverflowError: the C++ runner's size expressions past 64 bits)
PLAN_ERRORS = (IndexError, RuntimeError, ValueError, TypeError, OverflowError)


def raise_plan_failure(e, args: tuple, err: Exception) -> NoReturn:
    """Raise what a plan's run raising `err` (inputs past its guards; called in its `except`)
    reports: an out-of-range index met by ATen's own check (a plan without generated kernels)
    as the GuardError naming the input; memory and device failures as they are; anything else
    as an ArtifactError naming the plan, since a plan that fits its guards and its shapes runs
    (a hostile plan whose calls disagree with its slots, say)."""
    from aotc.runtime.indices import extern_index_error
    if args and isinstance(err, (IndexError, RuntimeError)):
        found = extern_index_error(e.plan, args, e.guards.bind(args))
        if found is not None:
            raise found from None
    device = getattr(torch, "AcceleratorError", torch.OutOfMemoryError)
    if isinstance(err, (torch.OutOfMemoryError, device)) or str(err).startswith("CUDA error"):
        raise err
    raise ArtifactError(**fill(PLAN_FAILED, entry=e.name, file=e.spec.plan,
                               found=_said(err))) from err


def _said(err: Exception) -> str:
    """An exception as a `found` value: its class and the first line of its message."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"


class Entry:
    """One entry point (`forward`, `backward`, ...): guards, compiled plan, output structure."""

    def __init__(self, name: str, spec, plan, weights: dict, device: torch.device,
                 library=None, *, static_weights: bool = True, state: dict | None = None,
                 runner: str | None = None):
        self.name, self.spec = name, spec
        self.guards = Guards(spec.inputs, spec.symbols, spec.relations)
        self.plan = plan
        unbound = sorted(plan.symbols - self.guards.bound_symbols - step_bound(plan))
        if unbound:
            raise ArtifactError(f"plan {spec.plan} sizes buffers with {unbound[0]}, which no "
                                "input dim binds", where=spec.plan,
                                expected=f"symbols read from inputs: "
                                         f"{sorted(self.guards.bound_symbols)}",
                                found=unbound, fix="re-export the model")
        try:
            self.function, self.runner = plan_function(plan, weights, device, library,
                                                       runner=runner,
                                                       static_weights=static_weights,
                                                       state=state)
        except AotcError:
            raise
        except (IndexError, RuntimeError, ValueError, TypeError) as err:   # at load: the views
            raise ArtifactError(   # of weights it takes once (a permute of duplicate dims, say)
                f"entry {name!r}: its plan fails on the weights at load", where=spec.plan,
                expected="calls on weights that fit them", found=_said(err),
                fix="re-export the model") from err
        # the C++ runner checks guards and runs the plan in one call (runtime/cpp_runner.py)
        self.direct = self.function.guarded(self.guards, device) if self.runner == "cpp" \
            else None
        self.tree = spec.output_tree


def allocate_state(states, plans: dict, device) -> dict:
    """The manifest's state as zeros, allocated only once the plans are checked against it
    (Artifact.plan: each state slot has its state's dtype and shape) and each state is one a
    plan uses: a size the plans do not bound is refused before any byte is allocated."""
    used = {s.state for plan in plans.values() for s in plan.slots if s.state is not None}
    for s in states:
        if s.name not in used:
            raise ArtifactError(f"state {s.name!r} is used by no plan",
                                where="manifest.json, state",
                                expected="only states that the plans' slots use",
                                found=f"{s.name} as {s.dtype}{list(s.shape)} ({s.nbytes} bytes)",
                                fix="re-export the model")
    return {s.name: torch.zeros(s.shape, dtype=getattr(torch, s.dtype), device=device)
            for s in states}


class CompiledModule:
    def __init__(self, artifact, device: torch.device, *, check_guards: bool,
                 cuda_graph: bool | None = None, cuda_graph_cache: int = MAX_GRAPHS,
                 runner: str | None = None):
        self.artifact, self.path, self.device = artifact, artifact.root, device
        self.manifest = artifact.manifest
        self.check_guards = check_guards
        self.options = dict(runner=runner, cuda_graph=cuda_graph, cuda_graph_cache=cuda_graph_cache)
        # the plans are built while the weights' bytes are checked (and on a GPU copied) on
        # other threads; what the plans derived from weights is recomputed once they are
        loading = start_weights(artifact, device)
        try:
            self.weights = loading.weights
            self.library = load_library_for(artifact, device)
            self.plans = checked_plans(artifact)   # the runner files checked against them
            self.state = allocate_state(self.manifest.state, self.plans, device)
            self.entries = self.bound_entries(self.state)
            pending = loading.pending
            loading.wait()
        finally:
            loading.close()
        for entry in self.entries.values() if pending else ():
            entry.function.refresh()
        self.graphs = self._graphs(cuda_graph, cuda_graph_cache)
        from aotc.runtime.tokenizer import carried
        self.tokenizer = carried(artifact)      # None: the artifact has no tokenizer/

    def bound_entries(self, state: dict) -> dict:
        """An Entry per entry of the manifest, its plan bound to the loaded weights and to
        `state` (the module's own, or a generator session's)."""
        return {name: Entry(name, spec, self.plans[name], self.weights, self.device,
                            self.library, state=state, runner=self.options["runner"])
                for name, spec in self.manifest.entries.items()}

    @property
    def runtime(self) -> str:
        """Which plan runner runs the entries: "cpp" (aotc's C++ runner), or "python (why)"."""
        return runtime_of(self.entries)

    @property
    def signer(self) -> str | None:
        """Who signed the artifact (a key id), when a trusted signature was required."""
        return self.artifact.signer

    def _graphs(self, wanted: bool | None, cache: int) -> dict:
        """Entries that replay CUDA graphs (runtime/graphs.py): on a GPU, by default;
        `cuda_graph=False` turns them off, `True` insists (and says why it cannot). Entries with
        dynamic dims keep up to `cache` graphs, one per set of sizes."""
        if not graphs_wanted(self.device, wanted, self.manifest.tensor_parallel is not None):
            return {}
        samples = lambda: [s[0]] if (s := self.recorded_samples()) else []   # noqa: E731
        state = list(self.state.values())
        return {name: GraphedEntry(e, self.device, samples if name == "forward" else None,
                                   max_graphs=cache, state=state)
                for name, e in self.entries.items()}

    def graph_status(self) -> dict[str, str]:
        """Per entry: 'graph' (replays a CUDA graph), 'pending' (captured on its first call;
        with dynamic dims, on the second call with the same sizes), or why it runs without
        one."""
        return {name: g.status() if (g := self.graphs.get(name)) else "off"
                for name in self.entries}

    # -------------------------------------------------------------------------------- calling
    def __call__(self, *args, **kwargs):
        return self.run("forward", *args, **kwargs)

    def run(self, entry: str, *args, **kwargs):
        """Run `entry` on its inputs, by position or by the model's parameter names
        (runtime/binding.py)."""
        args = bind_arguments(self.entries[entry].spec, args, kwargs, entry)
        return unflatten(self.entries[entry].tree, self.run_flat(entry, args))

    def run_flat(self, entry: str, args) -> tuple:
        """Run without rebuilding the output structure (benchmarks, `aotc verify`)."""
        e = self.entries[entry]
        args = tuple(args)
        try:
            if e.direct is not None and entry not in self.graphs:
                return e.direct(args, self.check_guards)
            symbols = e.guards.check(args, self.device) if self.check_guards else \
                e.guards.bind(args)
            with torch.no_grad():
                return self.graphs.get(entry, e.function)(args, symbols)
        except AotcError:
            raise
        except PLAN_ERRORS as err:
            raise_plan_failure(e, args, err)

    # --------------------------------------------------------------------------------- weights
    def state_dict(self):
        """The model's state_dict (parameters and persistent buffers, by their own names), as
        views of the loaded weights (runtime/statedict.py)."""
        from aotc.runtime.statedict import StateMap, state_dict
        return state_dict(StateMap(self.manifest, self.weights), self.weights)

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copy `state_dict` into the loaded weights in place, with torch's checks and messages
        (a StateDictError, which is a RuntimeError); kernels, plans and CUDA graphs are kept."""
        from aotc.runtime.statedict import load_into
        return load_into(self, state_dict, strict)

    # --------------------------------------------------------------------------- introspection
    @property
    def code(self) -> str:
        """The Python source each entry's plan was compiled to."""
        return "\n".join(e.function.source for e in self.entries.values())

    @property
    def inputs(self) -> list:
        return list(self.entries["forward"].spec.inputs)

    def signature(self, entry: str = "forward") -> str:
        spec = self.entries[entry].spec
        ins = signature_parameters(spec, [g.spec for g in self.entries[entry].guards.inputs])
        return f"{entry}({ins}) -> {describe(spec.output_tree, spec.outputs)}"

    def random_inputs(self, entry: str = "forward", *, seed: int = 0,
                      sizes: dict[str, int] | None = None) -> tuple:
        """Inputs that satisfy the entry's guards (integer inputs stay in their recorded range)."""
        return random_inputs(self.entries[entry].spec, self.device, seed=seed, sizes=sizes)

    def recorded_samples(self) -> tuple[tuple, tuple] | None:
        """(inputs, flat outputs) recorded at export, or None if the export recorded none."""
        if not self.artifact.listed(fmt.SAMPLE_INPUTS):
            return None
        ins = tensors(self.artifact.read(fmt.SAMPLE_INPUTS), fmt.SAMPLE_INPUTS)
        outs = tensors(self.artifact.read(fmt.SAMPLE_OUTPUTS), fmt.SAMPLE_OUTPUTS)
        order = lambda d: tuple(d[k].to(self.device) for k in sorted(d, key=_sample_key))  # noqa
        return order(ins), order(outs)

    def recorded_reference(self, outputs: tuple) -> dict[int, torch.Tensor]:
        """The float64 runs of the recorded `outputs` stored at export, {position: tensor}
        (none if the export stored none), each checked to be float64 of its output's shape."""
        rel = fmt.SAMPLE_REFERENCE
        if not self.artifact.listed(rel):
            return {}
        found = {_sample_key(k, rel): t for k, t in tensors(self.artifact.read(rel), rel).items()}
        for i, t in found.items():
            shape = list(outputs[i].shape) if i < len(outputs) else None
            if t.dtype != torch.float64 or list(t.shape) != shape:
                raise ArtifactError(f"the float64 reference of output #{i} does not fit it",
                                    where=f"{rel}, tensor {i}",
                                    expected=f"float64{shape}" if shape is not None else
                                    f"one of outputs 0..{len(outputs) - 1}",
                                    found=f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}",
                                    fix="re-export the model")
        return found

    def __repr__(self) -> str:
        return f"CompiledModule({str(self.path)!r}, device={self.device}, {self.signature()})"


def _sample_key(k: str, where: str = fmt.SAMPLE_INPUTS) -> int:
    if not k.isdigit() or len(k) > 6:
        raise ArtifactError(f"sample tensor {k[:40]!r} is not named by its position",
                            where=where, expected="names 0, 1, 2, ...", found=k[:40],
                            fix="re-export the model")
    return int(k)


def runtime_of(entries: dict) -> str:
    """One runner for every entry: its name; else each entry's."""
    runners = {e.runner for e in entries.values()}
    if len(runners) == 1:
        return runners.pop()
    return ", ".join(f"{name}: {e.runner}" for name, e in entries.items())


def graphs_wanted(device: torch.device, wanted: bool | None, collectives: bool = False) -> bool:
    """Whether to replay CUDA graphs given `aotc.load(cuda_graph=wanted)`: on a GPU unless
    turned off, or the plans call collectives (not captured in graphs yet: a multi-GPU
    issue); insisting on them anywhere else is a UsageError."""
    if wanted is False or (collectives and not wanted):
        return False
    if collectives:
        from aotc.errors import UsageError
        raise UsageError("CUDA graphs of tensor-parallel plans (with collectives) are not "
                         "supported yet", where="aotc.load(cuda_graph=True)",
                         expected="cuda_graph unset or False", found=True,
                         fix="load without cuda_graph=True")
    if device.type != "cuda":
        if wanted:
            from aotc.errors import UsageError
            raise UsageError("CUDA graphs need a CUDA device", where="aotc.load(cuda_graph=)",
                             expected="device='cuda'", found=str(device),
                             fix="load on a GPU, or leave cuda_graph unset")
        return False
    return True


def load_library_for(artifact, device: torch.device | None = None):
    native = artifact.manifest.target.native
    if native is None:
        return None
    if isinstance(native, TritonNative):   # CUDA artifacts: cubins, or Triton's interpreter
        return _triton_kernels(artifact, native, device)
    level = select_level(native, artifact.isa)
    rel = native.library(level)
    return NativeLibrary(artifact.read(rel), native, artifact.manifest.files[rel].sha256, level)


def _triton_kernels(artifact, native, device: torch.device | None):
    """Cubins on a GPU; on the CPU (only with `interpret=True`) the kernels' Triton sources
    run by Triton's interpreter (runtime/interpret.py, a testing aid)."""
    if device is not None and device.type == "cpu":
        from aotc.runtime.interpret import InterpretedKernels
        return InterpretedKernels(artifact, native, device)
    from aotc.runtime.cuda import CudaKernels
    return CudaKernels(artifact, native, device if device is not None else torch.device("cuda"))


def resolve_device(manifest, device, interpret: bool = False) -> torch.device:
    """The device to run on: the caller's choice, else the one the artifact was built for."""
    target = manifest.target
    if interpret:
        return _interpret_device(target, device)
    dev = _parse_device(device if device is not None else target.device.value)
    if dev.type != target.device.value and not target.portable:
        raise TargetError(f"artifact was built for {target.device.value} and cannot run on "
                          f"{dev}", where="manifest target", expected=target.device.value,
                          found=str(dev), fix=f"load it with device='{target.device.value}' or "
                                              f"re-export with --target {dev.type}")
    if isinstance(target.native, CppNative):
        select_level(target.native)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TargetError("artifact is to run on CUDA but this torch sees no GPU",
                          where="torch.cuda.is_available()", expected=True, found=False,
                          fix="run on a GPU host, or load with device='cpu' if the artifact "
                              "is portable")
    return dev


def _parse_device(device) -> torch.device:
    from aotc.errors import UsageError
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"{device!r} is not a device", where="device", expected="cpu, cuda or "
                         "cuda:N", found=repr(device)[:60], fix="pass device='cpu' or 'cuda'") \
            from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"aotc runs on cpu and cuda devices, not {dev.type}", where="device",
                         expected="cpu, cuda or cuda:N", found=str(dev),
                         fix="pass device='cpu' or 'cuda'")
    return dev


def _interpret_device(target, device) -> torch.device:
    """`interpret=True` (a testing aid) runs a CUDA artifact's Triton kernels on the CPU; a
    portable artifact (no kernels at all) simply runs there."""
    from aotc.errors import UsageError
    if target.native is not None and not isinstance(target.native, TritonNative):
        raise UsageError("interpret=True runs the Triton kernels of CUDA artifacts; this "
                         f"artifact holds C++ kernels for {target.device.value}",
                         where="aotc.load(interpret=True)", expected="a cuda artifact",
                         found=target.device.value, fix="load it without interpret=True")
    dev = _parse_device(device if device is not None else "cpu")
    if dev.type != "cpu":
        raise UsageError("Triton's interpreter runs on CPU tensors", where="aotc.load(device=)",
                         expected="cpu", found=str(dev),
                         fix="load with device='cpu' (or on a GPU without interpret=True)")
    return dev


class _SourceOnly:
    """Stands in for an artifact's kernels when only its plans' Python is wanted (`aotc
    inspect --code`): no library is loaded and no kernel source is run."""

    set_threads = None
    runs = False   # kernels folded at load are not run either (runtime/folding.py)

    def kernel(self, name: str, *args):
        def unavailable(*a):
            raise RuntimeError(f"kernel {name} is not loaded (source-only plan)")
        return unavailable

    def new_error_flag(self):
        return torch.zeros(1, dtype=torch.int32)


def plan_sources(artifact) -> str:
    """The Python source each entry's plan compiles to, built without loading any kernel."""
    weights = load_weights(artifact, torch.device("cpu"))
    library = _SourceOnly() if artifact.manifest.target.native is not None else None
    static = artifact.manifest.training is None
    return "\n".join(PlanFunction(artifact.plan(name), weights, torch.device("cpu"), library,
                                  static_weights=static).source
                     for name in artifact.manifest.entries)


def random_inputs(spec, device, *, seed: int = 0, sizes: dict[str, int] | None = None) -> tuple:
    """Inputs of entry `spec` that satisfy its guards (integer inputs stay in their recorded
    range; dynamic dims at their examples unless `sizes` names them), on `device`."""
    gen = torch.Generator().manual_seed(seed)
    bound = {name: s.example for name, s in spec.symbols.items()}
    unknown = sorted(set(sizes or {}) - set(bound))
    if unknown:
        raise GuardError(f"no dynamic dim named {unknown[0]!r}", where="sizes",
                         expected=sorted(bound) or "no dynamic dims", found=unknown,
                         fix="name one of the artifact's dynamic dims")
    bound.update(sizes or {})
    out = []
    for inp in spec.inputs:
        shape = [d if isinstance(d, int) else ex.evaluate(d, bound) for d in inp.shape]
        dtype = getattr(torch, inp.dtype)
        if dtype.is_floating_point or dtype.is_complex:
            t = torch.randn(shape, generator=gen).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            lo, hi = inp.values or (0, 9)
            t = torch.randint(lo, hi + 1, shape, generator=gen, dtype=dtype)
        out.append(t.to(device))
    return tuple(out)
