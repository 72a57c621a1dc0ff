"""The model's state at export: which weights are its state_dict, and leaving it as it was found.

`state_keys` maps each `model.state_dict()` key (parameters and persistent buffers, tied names
included) to the program weight it is; the other weights a program stores (non-persistent
buffers, lifted constants) are not state, so a state dict never carries them and loading one
never asks for them. State the captured graph does not read (strict capture lifts no unused
parameter, nor the `num_batches_tracked` of an eval-mode batch norm) is stored as well, so an
artifact's `state_dict()` is the model's whole state dict and the model's own loads strictly.

`untouched(model)` wraps an export: capture runs the model (eval mode for inference, train mode
and a backward for training) and would otherwise leave gradients in `.grad`, modules in another
mode, buffers updated and the random generators advanced, all of which the caller's next
optimizer step or forward would silently pick up.
"""
from __future__ import annotations

import contextlib

import torch


def state_keys(model: torch.nn.Module, weights: dict) -> tuple[dict[str, str], dict]:
    """({state_dict key: the name in `weights` holding its tensor (the key itself, or the name
    of the weight it is tied to)} in the model's state_dict order, {key: tensor} of the state
    `weights` lacks, to be stored beside it)."""
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    owner = {}
    for name, t in named:
        if name in weights:
            owner.setdefault(id(t), name)
    out, unread = {}, {}
    for key, t in model.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):   # extra state (get_extra_state) is no tensor
            continue
        if key in weights:
            out[key] = key
        elif id(t) in owner:
            out[key] = owner[id(t)]
        else:
            owner[id(t)] = out[key] = key
            unread[key] = t.detach()
    return out, unread


@contextlib.contextmanager
def untouched(model: torch.nn.Module):
    """Run the body, then restore `model`'s modes, gradients, buffers and the RNG states."""
    modes = [(m, m.training) for m in model.modules()]
    params = list(model.parameters())
    grads = [p.grad for p in params]
    for p in params:   # the body's gradients go to fresh tensors, never into the caller's
        p.grad = None
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
        for p, g in zip(params, grads):
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                if b.shape == saved.shape and not torch.equal(b, saved):
                    b.copy_(saved)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
