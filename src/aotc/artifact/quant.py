"""Weight-only quantization numerics, one function for export and for weight swaps.

int8, symmetric, per output channel: a weight W [N, K] (an nn.Linear's, or an embedding table
[rows, dim] per row) is stored as q = round(W / s) clamped to [-127, 127], int8 [N, K], and
s = max(|W[n, :]|) / 127, float32 [N] (a row of zeros gets s = 1, so q is 0 and nothing divides
by zero). The model computes with q converted to its own dtype (exact: |q| <= 127 fits every
float dtype's significand) and s applied to the product's columns, y = (x @ q^T) * s, which is
W's product up to the rounding of W to q * s, at most s / 2 per weight.

int4, symmetric, per group of G consecutive weights of a row (G = 32, 64 or 128, dividing K):
s = max(|W[n, g*G:(g+1)*G]|) / 7, float32 [N, K/G] (a group of zeros gets s = 1), and
q = round(W / s) in [-7, 7], stored as the unsigned nibble q + 8 (1..15), two a byte: byte j of
row n holds weight 2j in its low four bits and weight 2j + 1 in its high four, uint8 [N, K/2].
Symmetric, because a zero point per group is one more tensor every decode step reads (1/G of a
byte per weight) and one more operation per weight in the kernels, and the weights of the
models served (LLaMA-shaped projections) are centred on zero group by group, where a zero point
buys little; the nibble 0 (q = -8) is never written. Dequantized, W ~ (nibble - 8) * s, exact in
every float dtype, with the product rounded once to the model's dtype.

fp8 (CUDA targets of sm_89 and later, whose tensor cores and converts have e4m3): as int8, per
output channel, with s = max(|W[n, :]|) / 448 (e4m3's largest finite value) and q = W / s
rounded to float8_e4m3fn [N, K] (round to nearest even, 3 mantissa bits: a relative step of
2^-4 rather than int8's uniform one); the model computes with q converted to its dtype.

The exporter rewrites layers with `quantize` (exporter/quantize.py); `load_state_dict` and
`aotc swap-weights` quantize a full-precision state dict with the same function
(`quantize_state`), so an artifact's weights are the same bytes whichever way they arrived.
"""
from __future__ import annotations

import torch

SCHEMES = ("int8", "int4", "fp8")
QMAX = {"int8": 127, "int4": 7, "fp8": 448.0}
FP8_MIN_ARCH = 89          # sm_89 (Ada) and later convert e4m3 in hardware
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 64
NIBBLE_ZERO = 8
WEIGHT_SUFFIX = {"int8": "_int8", "int4": "_int4", "fp8": "_fp8"}
SCALE_SUFFIX = "_scale"
STORED_DTYPE = {"int8": torch.int8, "int4": torch.uint8, "fp8": torch.float8_e4m3fn}


def stored_shapes(scheme: str, shape, group_size: int | None) -> tuple[tuple, tuple]:
    """(values' shape, scales' shape) a layer of full-precision `shape` (N, K) stores."""
    n, k = shape
    if scheme == "int4":
        return (n, k // 2), (n, k // group_size)
    return (n, k), (n,)


def check_group(k: int, group_size: int) -> str | None:
    """Why a row of k weights cannot be grouped by `group_size` for int4, or None."""
    if group_size not in GROUP_SIZES:
        return f"group size {group_size} is not one of {list(GROUP_SIZES)}"
    if k % group_size:
        return f"{k} weights a row are not a multiple of the group size {group_size}"
    return None


def quantize(w: torch.Tensor, scheme: str = "int8",
             group_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, scales) of a 2-d floating weight (see above): int8 or float8_e4m3fn [N, K] and
    float32 [N], or for int4 packed uint8 [N, K/2] and float32 [N, K/G]. Computed in float32
    whatever w's dtype, so a bf16 and an fp32 copy of the same values give the same bytes."""
    if scheme not in QMAX:
        raise ValueError(f"unknown quantization scheme {scheme!r}")
    w32 = w.detach().to(torch.float32)
    if scheme == "int4":
        why = check_group(w32.shape[1], group_size or DEFAULT_GROUP_SIZE)
        if why:
            raise ValueError(why)
        w32 = w32.reshape(w32.shape[0], -1, group_size or DEFAULT_GROUP_SIZE)
    amax = w32.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / QMAX[scheme], torch.ones_like(amax))
    if scheme == "fp8":
        q = (w32 / scale[:, None]).clamp_(-QMAX[scheme], QMAX[scheme])
        return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()
    q = torch.round(w32 / scale[..., None]).clamp_(-QMAX[scheme], QMAX[scheme])
    if scheme == "int4":
        return pack_int4((q + NIBBLE_ZERO).to(torch.uint8).flatten(1)), scale.contiguous()
    return q.to(torch.int8).contiguous(), scale.contiguous()


def pack_int4(nibbles: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K] of values 0..15 -> uint8 [..., K/2], two a byte, the even one low."""
    return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """float32 [..., K] of the signed values (nibble - 8) of packed uint8 [..., K/2]. Written in
    the ops codegen lowers (a mask, a float scaling by 1/16 instead of a shift, exact), since
    quantized layers compute with it in the captured graph (exporter/quantize.py)."""
    lo = (packed & 15).to(torch.float32)
    hi = (packed & 240).to(torch.float32) * 0.0625
    both = torch.stack([lo, hi], dim=-1)
    return both.reshape(*packed.shape[:-1], packed.shape[-1] * 2) - NIBBLE_ZERO


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 [..., K] of packed [..., K/2] with scales [..., K/G], one per group of G."""
    values = unpack_int4(packed)
    groups = values.reshape(*scale.shape, -1) * scale[..., None]
    return groups.reshape(values.shape)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """The weight q stands for, in `dtype` (for tests and for models that read a layer's
    weight): int8 values times their row's scale, or packed int4 (uint8) values times their
    group's."""
    if q.dtype == torch.uint8:
        return dequantize_int4(q, scale).to(dtype)
    return (q.to(torch.float32) * scale[:, None]).to(dtype)


def stored_names(key: str, scheme: str = "int8") -> tuple[str, str]:
    """The stored names of a quantized weight's key `....weight`: its values and scales."""
    return key + WEIGHT_SUFFIX[scheme], key + SCALE_SUFFIX


def quantize_state(state: dict, layers: dict) -> dict:
    """A state dict with every full-precision weight of a quantized layer replaced by its
    values and scales under the stored names (`layers`: key -> QuantLayer of the manifest);
    keys already in quantized form, and all others, pass through as they are."""
    out = {}
    for key, value in state.items():
        layer = layers.get(key)
        if layer is None or not isinstance(value, torch.Tensor) or \
                not value.is_floating_point() or value.dim() != 2 or \
                (layer.group_size and check_group(value.shape[1], layer.group_size)):
            out[key] = value          # (rows groups cannot split: the loader's key check)
            continue
        q, s = quantize(value, layer.scheme, layer.group_size)
        out[layer.weight], out[layer.scale] = q, s
    return out
