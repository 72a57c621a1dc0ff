"""The float64 reference: the model run in float64 on the example inputs, recorded beside the
eager outputs so that export's proof and `aotc verify` can tell float32 rounding from a wrong
result (`aotc/prove.py`, `within_reference`).

A deep float32 model's eager output is itself 1e-4 away from the exact one (a 16-layer ViT:
1.1e-4 at values of 3), so a fixed elementwise tolerance against eager refuses an artifact as
accurate as eager; an output then passes if it is as close to the float64 result as eager's is
(up to a factor). The reference costs one float64 run at export, the model called with float64
copies of its weights (torch.func.functional_call: the model itself is not copied or changed);
it is skipped for models whose float64 weights would pass `MAX_WEIGHT_BYTES`, and where the
float64 run fails or gives outputs of other shapes (a model that only runs in its own dtype).
"""
from __future__ import annotations

import torch

from aotc.exporter.outputs import follow

MAX_WEIGHT_BYTES = 2 << 30       # float64 copies of the weights, at most
MAX_OUTPUT_BYTES = 64 << 20      # the reference stored in the artifact, at most


def float64_reference(model: torch.nn.Module, args: tuple, paths: list,
                      flat_out: tuple) -> dict[int, torch.Tensor] | None:
    """{flat output position: its float64 reference} for the floating outputs in `flat_out`
    (eager's, flattened along `paths`), or None where there is none to record."""
    floating = [i for i, t in enumerate(flat_out) if t.is_floating_point()]
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    weight_bytes = sum(t.numel() * 8 for t in state.values() if t.is_floating_point())
    if not floating or weight_bytes > MAX_WEIGHT_BYTES or \
            sum(flat_out[i].numel() * 8 for i in floating) > MAX_OUTPUT_BYTES:
        return None
    wide = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    before = torch.get_default_dtype()
    try:   # a model that makes its own float tensors makes them in float64 too
        torch.set_default_dtype(torch.float64)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = torch.func.functional_call(model, {k: wide(v) for k, v in state.items()},
                                             tuple(wide(a) for a in args))
        ref = {i: follow(out, paths[i]).detach() for i in floating}
    except Exception:   # noqa: BLE001 - no reference is a result: the fixed tolerance applies
        return None
    finally:
        torch.set_default_dtype(before)
    if any(r.dtype != torch.float64 or r.shape != flat_out[i].shape for i, r in ref.items()):
        return None
    return {i: r.contiguous() for i, r in ref.items()}
