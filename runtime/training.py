"""Training artifacts at run time: an nn.Module whose call runs the compiled forward inside a
`torch.autograd.Function` whose backward runs the compiled backward.

Parameters are real `nn.Parameter`s (owned copies of the artifact's weights, under their
original dotted names), so `parameters()`, `named_parameters()`, `state_dict()`,
`load_state_dict()` and any optimizer work unchanged. Buffers the forward updates (batch-norm
running statistics) are copied back after each forward, as eager PyTorch does in place.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from aotc.runtime.module import Entry
from aotc.runtime.trees import unflatten


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, *args):
        n = len(module.param_list)
        inputs = args[n:]
        fwd = module.entries["forward"]
        if module.check_guards:
            fwd.guards.check(inputs, module.device)
        flat = fwd.function(inputs, {})
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
        tangents = [g if g is not None else torch.zeros(s, dtype=d, device=module.device)
                    for g, (s, d), need in zip(grads, ctx.out_meta, module.needs_grad) if need]
        bwd = module.entries["backward"]
        args = tuple(ctx.saved_tensors) + tuple(tangents)
        if module.check_guards:
            bwd.guards.check(args, module.device)
        res = bwd.function(args, {})
        n, nb = len(module.param_list), len(module.buffer_names)
        return (None, *res[:n], *res[n + nb:])


class TrainableModule(torch.nn.Module):
    """A training artifact, loaded: call it like the model; train it like the model."""

    def __init__(self, path: Path, manifest: dict, device: torch.device, weights: dict,
                 library, *, check_guards: bool = True):
        super().__init__()
        meta = manifest["training"]
        self.path, self.manifest, self.device = path, manifest, device
        self.check_guards = check_guards
        self.num_outputs, self.needs_grad = meta["num_outputs"], meta["needs_grad"]
        self.buffer_names = meta["buffers"]
        owned = {}
        for name in meta["params"]:
            owned[name] = _install(self, name, torch.nn.Parameter(weights[name].clone()))
        for name in meta["buffers"]:
            owned[name] = _install(self, name, weights[name].clone(), buffer=True)
        self.param_list = [owned[n] for n in meta["params"]]
        self.mutated_buffers = [owned[n] for n in meta["mutated"]]
        self.entries = {
            name: Entry(name, spec, json.loads((path / spec["plan"]).read_bytes()), owned,
                        device, library, static_weights=False)
            for name, spec in manifest["entries"].items()}

    def forward(self, *inputs):
        outs = _Step.apply(self, *self.param_list, *inputs)
        return unflatten(self.entries["forward"].spec["output_tree"], outs)

    def extra_repr(self) -> str:
        return f"artifact={str(self.path)!r}, training"


def _install(root: torch.nn.Module, dotted: str, value, buffer: bool = False):
    """Register `value` under a dotted name, creating plain container modules on the way."""
    *path, leaf = dotted.split(".")
    mod = root
    for part in path:
        if not hasattr(mod, part) or not isinstance(getattr(mod, part), torch.nn.Module):
            mod.add_module(part, torch.nn.Module())
        mod = getattr(mod, part)
    if buffer:
        mod.register_buffer(leaf, value)
    else:
        mod.register_parameter(leaf, value)
    return getattr(mod, leaf)
