"""Weight-only quantization numerics, one function for export and for weight swaps.

int8, symmetric, per output channel: a weight W [N, K] (an nn.Linear's, or an embedding table
[rows, dim] per row) is stored as q = round(W / s) clamped to [-127, 127], int8 [N, K], and
s = max(|W[n, :]|) / 127, float32 [N] (a row of zeros gets s = 1, so q is 0 and nothing divides
by zero). The model computes with q converted to its own dtype (exact: |q| <= 127 fits every
float dtype's significand) and s applied to the product's columns, y = (x @ q^T) * s, which is
W's product up to the rounding of W to q * s, at most s / 2 per weight.

The exporter rewrites layers with `quantize` (exporter/quantize.py); `load_state_dict` and
`aotc swap-weights` quantize a full-precision state dict with the same function
(`quantize_state`), so an artifact's weights are the same bytes whichever way they arrived.
"""
from __future__ import annotations

import torch

SCHEMES = ("int8",)
QMAX = {"int8": 127}
WEIGHT_SUFFIX, SCALE_SUFFIX = "_int8", "_scale"


def quantize(w: torch.Tensor, scheme: str = "int8") -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale float32 [N]) of a 2-d floating weight, per row (see above).
    Computed in float32 whatever w's dtype, so a bf16 and an fp32 copy of the same values give
    the same bytes."""
    if scheme not in QMAX:
        raise ValueError(f"unknown quantization scheme {scheme!r}")
    w32 = w.detach().to(torch.float32)
    amax = w32.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / QMAX[scheme], torch.ones_like(amax))
    q = torch.round(w32 / scale[:, None]).clamp_(-QMAX[scheme], QMAX[scheme]).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """q * scale per row, in `dtype` (for tests and for models that read a layer's weight)."""
    return (q.to(torch.float32) * scale[:, None]).to(dtype)


def stored_names(key: str) -> tuple[str, str]:
    """The stored names of a quantized weight's key `....weight`: its int8 values and scales."""
    return key + WEIGHT_SUFFIX, key + SCALE_SUFFIX


def quantize_state(state: dict, layers: dict) -> dict:
    """A state dict with every full-precision weight of a quantized layer replaced by its int8
    values and scales under the stored names (`layers`: key -> QuantLayer of the manifest);
    keys already in quantized form, and all others, pass through as they are."""
    out = {}
    for key, value in state.items():
        layer = layers.get(key)
        if layer is None or not isinstance(value, torch.Tensor) or \
                not value.is_floating_point() or value.dim() != 2:
            out[key] = value
            continue
        q, s = quantize(value, layer.scheme)
        out[layer.weight], out[layer.scale] = q, s
    return out
