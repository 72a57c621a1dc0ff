"""The tensors a plan binds at load: its weights, as their slots want them, and its state."""
from __future__ import annotations

import torch

from aotc.errors import ArtifactError
from aotc.artifact.dtypes import DTYPES
from aotc.artifact.schema.types import SlotKind


def load_transform(slot) -> str:
    """How a weight slot's tensor is made from the stored one at load (both front ends: the
    runner file records it for the C++ one, runtime/runner_file.py): "transpose", a free view;
    "channels_last", a copy made once; "" the stored tensor as it is."""
    if slot.layout == "transposed" and len(slot.shape) == 2:
        return "transpose"
    if slot.memory_format == "channels_last" and len(slot.shape) == 4:
        return "channels_last"
    return ""


def _weight(slot, weights: dict) -> torch.Tensor:
    """A weight as its slot wants it: "memory_format": "channels_last" (a convolution weight
    that the plan runs channels-last) is converted here, once, at load; "layout": "transposed"
    (a matmul weight stored as its [K, N] transpose, codegen/layouts.py) is bound as a view of
    the stored tensor, its logical [N, K] shape with strides [1, N], at no cost."""
    if slot.weight not in weights:
        raise ArtifactError(f"the plan uses weight {slot.weight!r}, which the weights file "
                            "lacks", where=slot.weight, expected="the weight", found="nothing",
                            fix="re-export the model")
    w = weights[slot.weight]
    if w.dtype != DTYPES[slot.dtype]:
        raise ArtifactError(f"weight {slot.weight!r} is {w.dtype} in the weights file, its "
                            f"plan slot says {slot.dtype}", where=slot.weight,
                            expected=slot.dtype, found=str(w.dtype).removeprefix("torch."),
                            fix="re-export the model (the weights file does not match the plan)")
    transform = load_transform(slot)   # (a stored tensor of another rank fails the shape check)
    if transform == "transpose" and w.dim() == 2:
        w = w.t()
    elif transform == "channels_last" and w.dim() == 4:
        w = w.contiguous(memory_format=torch.channels_last)
    if all(isinstance(d, int) for d in slot.shape) and tuple(w.shape) != slot.shape:
        raise ArtifactError(f"weight {slot.weight!r} has shape {list(w.shape)} in the weights "
                            f"file, its plan slot says {list(slot.shape)}", where=slot.weight,
                            expected=list(slot.shape), found=list(w.shape),
                            fix="re-export the model (the weights file does not match the plan)")
    return w


def bound_tensors(plan, weights: dict, state: dict) -> dict[int, torch.Tensor]:
    """The tensors a plan's weight and state slots are bound to at load, by slot."""
    out = {}
    for i, s in enumerate(plan.slots):
        if s.kind is SlotKind.WEIGHT:
            out[i] = _weight(s, weights)
        elif s.kind is SlotKind.STATE:
            if s.state not in state:
                raise ArtifactError(f"the plan uses state {s.state!r}, which the module lacks",
                                    where=s.state, expected="a state of the manifest",
                                    found="nothing", fix="re-export the model")
            out[i] = state[s.state]
    return out
