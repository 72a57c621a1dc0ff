"""CompiledModule: a loaded artifact, callable like the model it was exported from.

Each call checks the guards (on by default), binds symbolic sizes, runs the entry's compiled plan
and puts the flat outputs back into the model's own output structure. A CompiledModule holds no
per-call state, so several threads may call it at once (an entry that replays a CUDA graph
serialises its calls: the graph's buffers are shared; runtime/graphs.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from aotc.errors import GuardError, TargetError
from aotc.runtime import format as fmt
from aotc.runtime.executor import PlanFunction
from aotc.runtime.graphs import MAX_GRAPHS, GraphedEntry
from aotc.runtime.guards import Guards
from aotc.runtime.native import check_isa, load_library
from aotc.runtime.trees import describe, unflatten
from aotc.runtime.weights import load_safetensors


class Entry:
    """One entry point (`forward`, later `backward`): guards, compiled plan, output structure."""

    def __init__(self, name: str, spec: dict, plan: dict, weights: dict, device: torch.device,
                 library=None, *, static_weights: bool = True):
        self.name, self.spec = name, spec
        self.guards = Guards(spec["inputs"], spec.get("symbols", {}), spec.get("relations", []))
        self.plan = plan
        self.function = PlanFunction(plan, weights, device, library,
                                     static_weights=static_weights)
        self.tree = spec["output_tree"]


class CompiledModule:
    def __init__(self, path: Path, manifest: dict, device: torch.device, *, check_guards: bool,
                 cuda_graph: bool | None = None, cuda_graph_cache: int = MAX_GRAPHS):
        self.path, self.manifest, self.device = path, manifest, device
        self.check_guards = check_guards
        self.weights = weights = load_weights(path, manifest, device)
        self.library = load_library_for(path, manifest, device)
        self.entries = {
            name: Entry(name, spec, json.loads((path / spec["plan"]).read_bytes()), weights, device,
                        self.library)
            for name, spec in manifest["entries"].items()}
        self.graphs = self._graphs(cuda_graph, cuda_graph_cache)

    def _graphs(self, wanted: bool | None, cache: int) -> dict:
        """Entries that replay CUDA graphs (runtime/graphs.py): on a GPU, by default;
        `cuda_graph=False` turns them off, `True` insists (and says why it cannot). Entries with
        dynamic dims keep up to `cache` graphs, one per set of sizes."""
        if not graphs_wanted(self.device, wanted):
            return {}
        samples = lambda: [s[0]] if (s := self.recorded_samples()) else []   # noqa: E731
        return {name: GraphedEntry(e, self.device, samples if name == "forward" else None,
                                   max_graphs=cache)
                for name, e in self.entries.items()}

    def graph_status(self) -> dict[str, str]:
        """Per entry: 'graph' (replays a CUDA graph), 'pending' (captured on its first call;
        with dynamic dims, on the second call with the same sizes), or why it runs without
        one."""
        return {name: g.status() if (g := self.graphs.get(name)) else "off"
                for name in self.entries}

    # -------------------------------------------------------------------------------- calling
    def __call__(self, *args):
        return self.run("forward", *args)

    def run(self, entry: str, *args):
        return unflatten(self.entries[entry].tree, self.run_flat(entry, args))

    def run_flat(self, entry: str, args) -> tuple:
        """Run without rebuilding the output structure (benchmarks, `aotc verify`)."""
        e = self.entries[entry]
        args = tuple(args)
        symbols = e.guards.check(args, self.device) if self.check_guards else e.guards.bind(args)
        with torch.no_grad():
            return self.graphs.get(entry, e.function)(args, symbols)

    # --------------------------------------------------------------------------- introspection
    @property
    def code(self) -> str:
        """The Python source each entry's plan was compiled to."""
        return "\n".join(e.function.source for e in self.entries.values())

    @property
    def inputs(self) -> list[dict]:
        return self.entries["forward"].spec["inputs"]

    def signature(self, entry: str = "forward") -> str:
        spec = self.entries[entry].spec
        ins = ", ".join(f"{i['name']}: {i['dtype']}[{', '.join(map(str, i['shape']))}]"
                        for i in spec["inputs"])
        return f"{entry}({ins}) -> {describe(spec['output_tree'], spec['outputs'])}"

    def random_inputs(self, entry: str = "forward", *, seed: int = 0,
                      sizes: dict[str, int] | None = None) -> tuple:
        """Inputs that satisfy the entry's guards (integer inputs stay in their recorded range)."""
        from aotc.runtime.guards import compile_expr, evaluate
        gen = torch.Generator().manual_seed(seed)
        spec = self.entries[entry].spec
        bound = {name: r.get("example", r["min"]) for name, r in spec.get("symbols", {}).items()}
        unknown = sorted(set(sizes or {}) - set(bound))
        if unknown:
            raise GuardError(f"no dynamic dim named {unknown[0]!r}", where="sizes",
                             expected=sorted(bound) or "no dynamic dims", found=unknown,
                             fix="name one of the artifact's dynamic dims")
        bound.update(sizes or {})
        out = []
        for inp in spec["inputs"]:
            shape = [d if isinstance(d, int) else evaluate(compile_expr(d), bound)
                     for d in inp["shape"]]
            dtype = getattr(torch, inp["dtype"])
            if dtype.is_floating_point or dtype.is_complex:
                t = torch.randn(shape, generator=gen).to(dtype)
            elif dtype == torch.bool:
                t = torch.randint(0, 2, shape, generator=gen).bool()
            else:
                lo, hi = inp.get("values") or (0, 9)
                t = torch.randint(lo, hi + 1, shape, generator=gen, dtype=dtype)
            out.append(t.to(self.device))
        return tuple(out)

    def recorded_samples(self) -> tuple[tuple, tuple] | None:
        """(inputs, flat outputs) recorded at export, or None if the export recorded none."""
        files = self.manifest["files"]
        if fmt.SAMPLE_INPUTS not in files:
            return None
        ins = load_safetensors(self.path / fmt.SAMPLE_INPUTS)
        outs = load_safetensors(self.path / fmt.SAMPLE_OUTPUTS)
        order = lambda d: tuple(d[k].to(self.device) for k in sorted(d, key=lambda k: int(k)))
        return order(ins), order(outs)

    def __repr__(self) -> str:
        return f"CompiledModule({str(self.path)!r}, device={self.device}, {self.signature()})"


def graphs_wanted(device: torch.device, wanted: bool | None) -> bool:
    """Whether to replay CUDA graphs given `aotc.load(cuda_graph=wanted)`: on a GPU unless
    turned off; insisting on them anywhere else is a UsageError."""
    if wanted is False:
        return False
    if device.type != "cuda":
        if wanted:
            from aotc.errors import UsageError
            raise UsageError("CUDA graphs need a CUDA device", where="aotc.load(cuda_graph=)",
                             expected="device='cuda'", found=str(device),
                             fix="load on a GPU, or leave cuda_graph unset")
        return False
    return True


def load_weights(path: Path, manifest: dict, device: torch.device) -> dict:
    """The artifact's weights, memory-mapped (on CPU), with tied names resolved."""
    weights = load_safetensors(path / fmt.WEIGHTS)
    for alias, original in manifest["weights"].get("aliases", {}).items():
        weights[alias] = weights[original]
    if device.type != "cpu":
        weights = {k: v.to(device) for k, v in weights.items()}
    return weights


def load_library_for(path: Path, manifest: dict, device: torch.device | None = None):
    native = manifest["target"].get("native")
    if not native:
        return None
    if native.get("kind") == "triton":   # CUDA artifacts: cubins, or Triton's interpreter
        return _triton_kernels(path, native, device)
    return load_library(path, native)


def _triton_kernels(path: Path, native: dict, device: torch.device | None):
    """Cubins on a GPU; on the CPU (only with `interpret=True`) the kernels' Triton sources
    run by Triton's interpreter (runtime/interpret.py, a testing aid)."""
    if device is not None and device.type == "cpu":
        from aotc.runtime.interpret import InterpretedKernels
        return InterpretedKernels(path, native, device)
    from aotc.runtime.cuda import CudaKernels
    return CudaKernels(path, native, device if device is not None else torch.device("cuda"))


def resolve_device(manifest: dict, device, interpret: bool = False) -> torch.device:
    """The device to run on: the caller's choice, else the one the artifact was built for."""
    target = manifest["target"]
    if interpret:
        return _interpret_device(target, device)
    dev = torch.device(device if device is not None else target["device"])
    if dev.type != target["device"] and not target.get("portable", False):
        raise TargetError(f"artifact was built for {target['device']} and cannot run on {dev}",
                          where=f"target {target}", expected=target["device"], found=str(dev),
                          fix=f"load it with device='{target['device']}' or re-export with "
                              f"--target {dev.type}")
    if target.get("native") and target["native"].get("kind", "cpp") == "cpp":
        check_isa(target["native"])
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TargetError("artifact is to run on CUDA but this torch sees no GPU",
                          where="torch.cuda.is_available()", expected=True, found=False,
                          fix="run on a GPU host, or load with device='cpu' if the artifact "
                              "is portable")
    return dev


def _interpret_device(target: dict, device) -> torch.device:
    """`interpret=True` (a testing aid) runs a CUDA artifact's Triton kernels on the CPU; a
    portable artifact (no kernels at all) simply runs there."""
    from aotc.errors import UsageError
    native = target.get("native")
    if native is not None and native.get("kind") != "triton":
        raise UsageError("interpret=True runs the Triton kernels of CUDA artifacts; this "
                         f"artifact holds C++ kernels for {target['device']}",
                         where="aotc.load(interpret=True)", expected="a cuda artifact",
                         found=target["device"], fix="load it without interpret=True")
    dev = torch.device(device if device is not None else "cpu")
    if dev.type != "cpu":
        raise UsageError("Triton's interpreter runs on CPU tensors", where="aotc.load(device=)",
                         expected="cpu", found=str(dev),
                         fix="load with device='cpu' (or on a GPU without interpret=True)")
    return dev
