"""Training artifacts at run time: an nn.Module whose call runs the compiled forward inside a
`torch.autograd.Function` whose backward runs the compiled backward.

Parameters are real `nn.Parameter`s (owned copies of the artifact's weights, under their
original dotted names), so `parameters()`, `named_parameters()`, `state_dict()`,
`load_state_dict()` and any optimizer work unchanged: buffers the model registered as
non-persistent stay out of the state dict, and tied names are one Parameter, as in the model,
so the model's own `state_dict()` loads strictly. Buffers the forward updates (batch-norm
running statistics) are copied back after each forward, as eager PyTorch does in place.
"""
from __future__ import annotations

import torch

from aotc.runtime.guards import Guards
from aotc.errors import AotcError
from aotc.runtime.module import (PLAN_ERRORS, Entry, graphs_wanted, load_library_for,
                                 load_weights, raise_plan_failure, random_inputs)
from aotc.artifact.trees import unflatten
from aotc.runtime.runner_file import checked_plans


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, *args):
        n = len(module.param_list)
        inputs = args[n:]
        fwd = module.entries["forward"]
        if module.check_guards:
            fwd.guards.check(inputs, module.device)
        if module.graphs is not None:
            flat, ctx.token = module.graphs.forward(inputs)
        else:
            flat, ctx.token = _typed(fwd, inputs, lambda: fwd.function(inputs, {})), None
        nu, nm = module.num_outputs, len(module.mutated_buffers)
        outs, new_buffers, saved = flat[:nu], flat[nu:nu + nm], flat[nu + nm:]
        for buf, value in zip(module.mutated_buffers, new_buffers):
            buf.copy_(value)
        ctx.module = module
        ctx.out_meta = [(o.shape, o.dtype) for o in outs]
        ctx.save_for_backward(*saved)
        ctx.mark_non_differentiable(*[o for o, g in zip(outs, module.needs_grad) if not g])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        module = ctx.module
        tangents = tuple(g if g is not None else torch.zeros(s, dtype=d, device=module.device)
                         for g, (s, d), need in zip(grads, ctx.out_meta, module.needs_grad)
                         if need)
        if module.check_guards:   # what forward saved comes from the plan itself, unchecked:
            module.tangent_guards.check(tangents, module.device)   # some live on the host
        n, nb = len(module.param_list), len(module.buffer_names)
        bwd = module.entries["backward"]
        if module.graphs is not None:   # a replay reads what forward saved in the graph
            res = module.graphs.backward(ctx.token, lambda: _handed_over(ctx, tangents),
                                         tangents)
        elif module.params_only is not None and not any(ctx.needs_input_grad[1 + n:]):
            res = _typed(bwd, (), lambda: module.params_only(_handed_over(ctx, tangents), {}))
        else:
            res = _typed(bwd, (), lambda: bwd.function(_handed_over(ctx, tangents), {}))
        return (None, *res[:n], *res[n + nb:])


def _typed(entry, args: tuple, run):
    """`run()`, a plan's run (CUDA graphs' replays aside: their own errors say what to do),
    with its failures reported as an inference entry's are
    (runtime/module.py `raise_plan_failure`: an ArtifactError naming the plan, a GuardError for an
    index out of range, memory and device errors as they are). Backward's inputs are handed
    over and gone by then: its index errors are named without them."""
    try:
        return run()
    except AotcError:
        raise
    except PLAN_ERRORS as err:
        raise_plan_failure(entry, args, err)


def _handed_over(ctx, tangents: tuple) -> list:
    """Backward's inputs as a list the plan empties: with autograd's own references dropped
    too (as AOTAutograd's backward does, unless the graph is retained), each saved tensor is
    freed after its last use in backward instead of at its end."""
    args = [*ctx.saved_tensors, *tangents]
    clear = getattr(ctx, "maybe_clear_saved_tensors", None)
    if clear is not None:
        clear()
    return args


class TrainableModule(torch.nn.Module):
    """A training artifact, loaded: call it like the model; train it like the model."""

    def __init__(self, artifact, device: torch.device, *, check_guards: bool = True,
                 cuda_graph: bool | None = None, runner: str | None = None):
        super().__init__()
        manifest = artifact.manifest
        meta = manifest.training
        self.artifact, self.path, self.manifest, self.device = artifact, artifact.root, \
            manifest, device
        weights, library = load_weights(artifact, device), load_library_for(artifact, device)
        self.library = library
        self.check_guards = check_guards
        self.num_outputs, self.needs_grad = meta.num_outputs, list(meta.needs_grad)
        self.buffer_names = list(meta.buffers)
        owned = {}
        for name in (*meta.params, *meta.buffers):
            if name not in weights:
                from aotc.errors import ArtifactError
                raise ArtifactError(f"training state {name!r} is missing from the weights file",
                                    where="manifest training", expected="a stored weight",
                                    found="nothing", fix="re-export the model")
        keys = manifest.weights.state_dict   # None before format 6: every buffer persistent
        for name in meta.params:
            owned[name] = _install(self, name, torch.nn.Parameter(weights[name].clone()))
        for name in meta.buffers:
            owned[name] = _install(self, name, weights[name].clone(), buffer=True,
                                   persistent=keys is None or name in keys)
        for key in keys or ():    # a tied name: the same Parameter (or buffer) once more
            tied = manifest.weights.aliases.get(key)
            if key not in owned and tied in owned:
                _install(self, key, owned[tied], buffer=tied not in meta.params)
        self.param_list = [owned[n] for n in meta.params]
        self.buffer_list = [owned[n] for n in meta.buffers]
        self.mutated_buffers = [owned[n] for n in meta.mutated]
        plans = checked_plans(artifact)   # the runner files checked against them
        self.entries = {name: Entry(name, spec, plans[name], owned, device, library,
                                    static_weights=False, runner=runner)
                        for name, spec in manifest.entries.items()}
        # backward's inputs: what forward saved, then the gradients of the outputs (tangents).
        # Only tangents come from outside; saved tensors may live on the host (CUDA attention
        # saves its dropout seed and offset as CPU scalars).
        saved = saved_for_backward(manifest)["count"]
        self.tangent_guards = Guards(manifest.entries["backward"].inputs[saved:], {}, [])
        self.graphs = _graphs(self, device, cuda_graph)
        self.params_only = None if self.graphs is not None else _params_only_backward(
            self.entries["backward"].plan, len(meta.params) + len(meta.buffers), owned,
            device, library, runner)

    def forward(self, *inputs, **named):
        """The model's forward, its inputs by position or by name (runtime/binding.py)."""
        from aotc.runtime.binding import bind_arguments
        inputs = bind_arguments(self.entries["forward"].spec, inputs, named, "forward")
        outs = _Step.apply(self, *self.param_list, *inputs)
        return unflatten(self.entries["forward"].spec.output_tree, outs)

    def random_inputs(self, *, seed: int = 0, sizes: dict[str, int] | None = None) -> tuple:
        """Inputs of the model's forward that satisfy its guards (as CompiledModule's)."""
        return random_inputs(self.entries["forward"].spec, self.device, seed=seed, sizes=sizes)

    @property
    def runtime(self) -> str:
        """Which plan runner runs the entries (runtime/module.py CompiledModule.runtime)."""
        from aotc.runtime.module import runtime_of
        return runtime_of(self.entries)

    def graph_status(self) -> dict[str, str]:
        """Per entry: 'graph' (replays a CUDA graph), 'pending' (captured on its first call),
        'off', or why graphs were turned off (runtime/train_graphs.py)."""
        if self.graphs is None:
            return {name: "off" for name in self.entries}
        return self.graphs.status()

    def saved_for_backward(self) -> dict:
        """What one forward keeps for backward, from the manifest: {"count", "bytes"}."""
        return saved_for_backward(self.manifest)

    def extra_repr(self) -> str:
        return f"artifact={str(self.path)!r}, training"


def _params_only_backward(plan: dict, n_state: int, owned: dict, device, library, runner):
    """The backward plan without the inputs' gradients, for calls whose inputs need none (the
    usual case: data does not require grad), or None when the backward computes no input
    gradient. Same kernels; only the steps the other gradients need run (for the sample MLP,
    one matmul of six in backward)."""
    from aotc.runtime.cpp_runner import plan_function
    from aotc.artifact.encoding import without_outputs
    dropped = {i for i, o in enumerate(plan.outputs) if i >= n_state and o.slot is not None}
    if not dropped:
        return None
    return plan_function(without_outputs(plan, dropped), owned, device, library,
                         runner=runner, static_weights=False)[0]


def _graphs(module, device: torch.device, wanted: bool | None):
    """CUDA graphs for both entries (runtime/train_graphs.py): on a GPU by default (training
    artifacts have static sizes); `cuda_graph=False` turns them off."""
    if not graphs_wanted(device, wanted):
        return None
    from aotc.runtime.train_graphs import TrainingGraphs
    return TrainingGraphs(module, device)


def saved_for_backward(manifest: dict) -> dict:
    """The tensors a training artifact's forward returns for its backward (the outputs after
    the model's outputs and the updated buffers): {"count", "bytes", "tensors": [meta...]}.
    Shapes are static in training artifacts."""
    t = manifest.training
    metas = manifest.entries["forward"].outputs[t.num_outputs + len(t.mutated):]
    nbytes = 0
    for meta in metas:
        if meta:
            n = torch.empty((), dtype=getattr(torch, meta.dtype)).element_size()
            for d in meta.shape:
                n *= d if isinstance(d, int) else 0
            nbytes += n
    return {"count": len(metas), "bytes": nbytes,
            "tensors": [m.to_json() if m else None for m in metas]}


def _install(root: torch.nn.Module, dotted: str, value, buffer: bool = False,
             persistent: bool = True):
    """Register `value` under a dotted name, creating plain container modules on the way."""
    *path, leaf = dotted.split(".")
    mod = root
    for part in path:
        if not hasattr(mod, part) or not isinstance(getattr(mod, part), torch.nn.Module):
            mod.add_module(part, torch.nn.Module())
        mod = getattr(mod, part)
    if buffer:
        mod.register_buffer(leaf, value, persistent=persistent)
    else:
        mod.register_parameter(leaf, value)
    return getattr(mod, leaf)
