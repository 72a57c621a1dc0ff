"""The training benchmark's systems and its step: how each system is built into something
that trains, what one step is (projection loss over the outputs, backward), and what is
measured of a step besides its time (gradients, bytes saved for backward, device memory).
benchmarks/training.py runs them over the models; see its docstring for the protocol.
"""
from __future__ import annotations

import copy
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from benchmarks import systems
from benchmarks.accuracy import flatten

SYSTEMS = {"cpu": ("eager", "torch.compile", "aotc"),
           "cuda": ("eager", "torch.compile", "torch.compile:reduce-overhead", "aotc")}
LOSS_SEED = 1234     # the loss's fixed projection weights
STEP_SEED = 7        # dropout masks of the steps whose gradients are compared


# --------------------------------------------------------------------------------- systems
@dataclass(kw_only=True, slots=True)
class Trainee:
    """A system ready to train: `module` owns the parameters, `forward()` runs it once on the
    benchmark inputs."""
    module: torch.nn.Module
    forward: object
    build_s: float | None = None
    load_s: float | None = None
    artifact_bytes: int | None = None
    manifest_saved: dict | None = None   # aotc: what its manifest says forward saves


class EagerTrain(systems.System):
    name = "eager"

    def build(self, model, inputs, workdir):
        return Trainee(module=model, forward=lambda: model(*inputs))


class CompileTrain(systems.TorchCompile):
    """torch.compile (name, modes and availability as in the inference benchmark)."""

    def build(self, model, inputs, workdir):
        model = copy.deepcopy(model)
        compiled = torch.compile(model, mode=None if self.mode == "default" else self.mode)
        return Trainee(module=model, forward=lambda: compiled(*inputs))


class AotcTrain(systems.System):
    cache_env = "XDG_CACHE_HOME"

    def __init__(self, cuda_graph: bool | None = None):
        self.cuda_graph = cuda_graph
        self.name = "aotc" if cuda_graph is None else "aotc:no-graph"

    def available(self, device):
        if self.cuda_graph is False and device.type != "cuda":
            return "CUDA graphs are only used on CUDA devices"
        return None

    def build(self, model, inputs, workdir):
        import aotc
        device = inputs[0].device
        t0 = time.perf_counter()
        path = aotc.export(copy.deepcopy(model), inputs, workdir / "model.aotc", train=True,
                           target=device.type)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        module = aotc.load(path, device=device, cuda_graph=self.cuda_graph)
        load_s = time.perf_counter() - t0
        saved = module.saved_for_backward()
        return Trainee(module=module, forward=lambda: module(*inputs), build_s=build_s,
                       load_s=load_s, artifact_bytes=systems.directory_bytes(path),
                       manifest_saved={"count": saved["count"], "bytes": saved["bytes"]})


TRAIN_SYSTEMS = {s.name: s for s in (EagerTrain(), CompileTrain(),
                                      CompileTrain("reduce-overhead"), AotcTrain(),
                                      AotcTrain(cuda_graph=False))}


def select(names: list[str] | None, device: str = "cpu") -> list[systems.System]:
    """The systems to run, eager first; those unavailable on `device` are left out (said
    once on stderr)."""
    unknown = sorted(set(names or ()) - set(TRAIN_SYSTEMS))
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)}; known: "
                         f"{', '.join(TRAIN_SYSTEMS)}")
    wanted = ["eager"] + [n for n in (names or SYSTEMS[device]) if n != "eager"]
    chosen = []
    for n in wanted:
        why = TRAIN_SYSTEMS[n].available(torch.device(device))
        if why:
            print(f"skipping {n}: {why}", file=sys.stderr)
        else:
            chosen.append(TRAIN_SYSTEMS[n])
    return chosen


@contextmanager
def eager_rng_in_inductor():
    """Inductor draws dropout masks from torch's generator (as eager and aotc do) while this
    benchmark runs, so one seed gives every system the same masks."""
    import torch._inductor.config as inductor_config
    with inductor_config.patch(fallback_random=True):
        yield


# ------------------------------------------------------------------------------ one step
def projection_weights(outputs, seed: int = LOSS_SEED) -> list[torch.Tensor]:
    """The loss's fixed weights: one float32 tensor per floating output, on its device."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g).to(o.device) for o in flatten(outputs)
            if o.is_floating_point()]


def projection_loss(outputs, weights: list[torch.Tensor]) -> torch.Tensor:
    outs = [o for o in flatten(outputs) if o.is_floating_point()]
    if len(outs) != len(weights):
        raise RuntimeError(f"{len(outs)} floating outputs, the loss has {len(weights)} weights")
    return sum((o.to(w.dtype) * w).sum() for o, w in zip(outs, weights))


def make_step(t: Trainee, weights: list[torch.Tensor]):
    params = [p for p in t.module.parameters() if p.requires_grad]

    def step():
        for p in params:
            p.grad = None
        projection_loss(t.forward(), weights).backward()
    return step


def gradients(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.detach().clone())
            for n, p in module.named_parameters() if p.requires_grad}


def seeded_step(step, module, seed: int = STEP_SEED) -> dict:
    """One step with the dropout masks of `seed`; the gradients it gave."""
    torch.manual_seed(seed)
    step()
    return gradients(module)


def grad_list(grads: dict, names: list[str], like: dict) -> list[torch.Tensor]:
    """Gradients in eager's parameter order; a missing one (None) counts as zeros."""
    out = []
    for n in names:
        g = grads.get(n)
        out.append(torch.zeros_like(like[n]) if g is None else g)
    return out


def saved_for_backward(t: Trainee, weights: list, inputs: tuple, device) -> dict:
    """Step 7: one step with saved-tensor hooks: the distinct storages saved for backward that
    are not parameters, buffers, inputs or loss weights (count and bytes); on CUDA also the
    step's peak allocation above the memory in use before it."""
    exclude = {x.untyped_storage().data_ptr()
               for x in [*t.module.parameters(), *t.module.buffers(), *inputs, *weights]}
    seen: dict[int, int] = {}
    calls = [0]

    def pack(x):
        calls[0] += 1
        storage = x.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in exclude:
            seen[ptr] = storage.nbytes()
        return x

    for p in t.module.parameters():
        p.grad = None
    out: dict = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = projection_loss(t.forward(), weights)
    out.update(saved_bytes=sum(seen.values()), saved_tensors=len(seen), saved_calls=calls[0])
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        out["step_peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
    return out


def held_memory(step, base: int, t: Trainee, model) -> int:
    """Device memory a second step needs, the first step's caches released: the peak reserved
    during it over what was reserved before the system was built, less the system's own copy
    of the parameters (aotc's loaded artifact owns one; torch.compile's is this benchmark's
    deepcopy): activations, saved tensors, gradients, workspaces and CUDA graph pools."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    copies = sum(p.numel() * p.element_size() for p in t.module.parameters()
                 if p.untyped_storage().data_ptr() not in own)
    return torch.cuda.max_memory_reserved() - base - copies
