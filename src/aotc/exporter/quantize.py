"""`--quantize int8|int4|fp8`: weight-only quantization, as a rewrite of the model before capture.

    model -> select layers (every nn.Linear; --quantize-skip patterns kept; embeddings and the
             LM head on request; int4: rows the group size divides) -> swap each for a
             quantized module -> capture as usual

A quantized linear layer holds its weight as int8 (or fp8) values [N, K] and float32 scales [N]
(artifact/quant.py, per output channel) and computes y = (x @ q^T) * s + b, with q converted to
x's dtype; an int4 layer holds packed uint8 [N, K/2] and float32 scales [N, K/G] and computes
x @ W^T + b with W unpacked and scaled per group in x's dtype (artifact/quant.py's
dequantize_int4: masks and a float scaling, ops codegen lowers). Captured, that is ATen's own
ops over the stored values, so codegen needs no new op: on a GPU, products of 1 to 8 rows (decode)
run aotc's quantized-weight kernel, which reads the stored bytes and dequantizes them in
registers (codegen/lowering/quantized.py), and int8's scales multiply the product's columns in
the kernels that read it; larger products and every product on a CPU (but int8's one-row
product, a C++ reduction over the int8 rows) run the vendor GEMM over the converted weight,
which a C++ or Triton kernel writes from the stored values. The artifact stores values and
scales under the layer's names (`fc1.weight_int8` / `_int4` / `_fp8`, `fc1.weight_scale`), and
its manifest lists each layer (artifact/schema/quant.py) with the accuracy measured here: the
quantized model against the unquantized one on the example inputs (relative L2 of the outputs;
for generators, the greedy tokens that agree over the recorded prompt and the tokens generated
after it).

The swap is undone when export is done, so the caller's model is left as it was.
"""
from __future__ import annotations

import contextlib
import fnmatch

import torch
import torch.nn.functional as F

from aotc.errors import ExportError, UsageError
from aotc.artifact.quant import (DEFAULT_GROUP_SIZE, check_group, dequantize, dequantize_int4,
                                 quantize, stored_names)


class _QuantizedWeight(torch.nn.Module):
    """A module's weight as quantized values and scales (buffers `weight_int8` or
    `weight_int4`, and `weight_scale`: the stored names of artifact/quant.py), and the dtype
    it computes in."""

    def __init__(self, weight: torch.Tensor, scheme: str, group_size: int | None = None):
        super().__init__()
        q, s = quantize(weight, scheme, group_size)
        self.values_name = stored_names("weight", scheme)[0]
        self.register_buffer(self.values_name, q.to(weight.device))
        self.register_buffer("weight_scale", s.to(weight.device))
        self.scheme, self.compute_dtype = scheme, weight.dtype

    @property
    def values(self) -> torch.Tensor:
        return getattr(self, self.values_name)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight, for model code that reads a layer's weight directly."""
        return dequantize(self.values, self.weight_scale, self.compute_dtype)


class QuantizedLinear(_QuantizedWeight):
    """An nn.Linear with its weight quantized per output channel (int8) or per group (int4)."""

    def __init__(self, linear: torch.nn.Linear, scheme: str, group_size: int | None = None):
        super().__init__(linear.weight, scheme, group_size)
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x):
        if self.scheme == "int4":    # the weight in x's dtype, unpacked as the kernels read it
            y = F.linear(x, dequantize_int4(self.values, self.weight_scale).to(x.dtype))
        else:
            y = (F.linear(x, self.values.to(x.dtype)) * self.weight_scale).to(x.dtype)
        return y if self.bias is None else y + self.bias


class QuantizedEmbedding(_QuantizedWeight):
    """An nn.Embedding with its table quantized per row (int8) or per group of a row (int4)."""

    def __init__(self, emb: torch.nn.Embedding, scheme: str, group_size: int | None = None):
        super().__init__(emb.weight, scheme, group_size)
        self.num_embeddings, self.embedding_dim = emb.num_embeddings, emb.embedding_dim
        self.padding_idx = emb.padding_idx

    def forward(self, ids):
        if self.scheme == "int4":
            rows = dequantize_int4(self.values[ids], self.weight_scale[ids])
        else:
            rows = self.values[ids].to(torch.float32) * self.weight_scale[ids].unsqueeze(-1)
        return rows.to(self.compute_dtype)


def _patterns(options) -> list[str]:
    return [p.strip() for p in (options.quantize_skip or "").split(",") if p.strip()]


def _lm_heads(model) -> set[int]:
    """ids of the modules that are the model's LM head: transformers' output embeddings, a
    top-level `lm_head`, and any linear layer whose weight is tied to an embedding table or
    whose outputs are as many as an embedding table's rows (logits over its vocabulary)."""
    heads = set()
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    for m in (head, getattr(model, "lm_head", None)):
        if isinstance(m, torch.nn.Linear):
            heads.add(id(m))
    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    tables, vocab = {id(m.weight) for m in embeddings}, {m.num_embeddings for m in embeddings}
    heads |= {id(m) for m in model.modules() if isinstance(m, torch.nn.Linear)
              and (id(m.weight) in tables or m.out_features in vocab)}
    return heads


def select(model: torch.nn.Module, options) -> dict[str, torch.nn.Module]:
    """{module name: module} of the layers `options` quantize (see the module docstring)."""
    skip, heads, group = _patterns(options), _lm_heads(model), group_size(options)
    chosen = {}
    for name, m in model.named_modules():
        key = f"{name}.weight"
        if not name or any(fnmatch.fnmatchcase(key, p) for p in skip):
            continue
        if group is not None and getattr(m, "weight", None) is not None and \
                m.weight.dim() == 2 and check_group(m.weight.shape[1], group):
            continue           # rows that groups of this size do not divide: full precision
        if isinstance(m, torch.nn.Linear) and m.weight.is_floating_point():
            if id(m) not in heads or options.quantize_lm_head:
                chosen[name] = m
        elif isinstance(m, torch.nn.Embedding) and options.quantize_embeddings and \
                m.max_norm is None and m.weight.is_floating_point():
            chosen[name] = m
    if not chosen:
        raise UsageError("--quantize found no layer to quantize", where="--quantize",
                         expected="nn.Linear (or, with --quantize-embeddings, nn.Embedding) "
                                  "layers not matched by --quantize-skip (int4: with rows "
                                  "that --group-size divides)",
                         found=f"none (skip patterns: {skip or 'none'})",
                         fix="drop --quantize, or loosen --quantize-skip")
    return chosen


def group_size(options) -> int | None:
    """The int4 group size `options` ask for (64 unless --group-size), None for int8."""
    return (options.group_size or DEFAULT_GROUP_SIZE) if options.quantize == "int4" else None


def layers_json(chosen: dict, scheme: str, group: int | None = None) -> dict:
    """The manifest's quantization.layers of the chosen modules."""
    out = {}
    for name, m in chosen.items():
        key = f"{name}.weight"
        weight, scale = stored_names(key, scheme)
        out[key] = {"kind": "linear" if isinstance(m, torch.nn.Linear) else "embedding",
                    "scheme": scheme, "dtype": str(m.weight.dtype).removeprefix("torch."),
                    "shape": list(m.weight.shape), "weight": weight, "scale": scale}
        if group is not None:
            out[key]["group_size"] = group
    return out


@contextlib.contextmanager
def quantized(model: torch.nn.Module, chosen: dict, scheme: str, group: int | None = None):
    """The model with the chosen modules swapped for quantized ones, put back on exit."""
    swapped = []
    try:
        for name, m in chosen.items():
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            new = QuantizedLinear(m, scheme, group) if isinstance(m, torch.nn.Linear) \
                else QuantizedEmbedding(m, scheme, group)
            setattr(parent, attr, new)
            swapped.append((parent, attr, m))
        yield model
    finally:
        for parent, attr, m in reversed(swapped):
            setattr(parent, attr, m)


def check_error(accuracy: dict, limit: float | None) -> None:
    """An ExportError when the measured relative error is above `--max-quant-error`."""
    if limit is None or accuracy.get("rel_l2") is None or accuracy["rel_l2"] <= limit:
        return
    raise ExportError(f"the quantized model's outputs are {accuracy['rel_l2']:.4g} away from "
                      f"the unquantized model's (relative L2), above --max-quant-error {limit}",
                      where="--max-quant-error", expected=f"relative L2 error <= {limit}",
                      found=accuracy["rel_l2"],
                      fix="keep the most sensitive layers in full precision with "
                          "--quantize-skip PATTERN (the LM head, the first and last layers), "
                          "or raise --max-quant-error")
