"""Decomposition to aotc's core op set, with aotc's own table.

The exported graph is re-traced op by op under `make_fx` with fake tensors, functionalized, with
aotc's decomposition table. This replaces `ExportedProgram.run_decompositions`, which fails on
real models (GPT-2 in torch 2.13: a `view` of a tensor whose strides a decomposition changed).
Two rules make the re-trace robust:
  * every `view` is replayed as `reshape`, which is a view where the strides allow it and a copy
    where they do not (later passes treat views as index remaps, so nothing is lost);
  * decompositions come from torch's core ATen table minus the ops aotc keeps whole because its
    backends have better kernels for them (KEEP); composite ops that decompose inside the
    dispatcher (attention) are kept whole through mirror custom ops (MIRRORS).
"""
from __future__ import annotations

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten

# Ops kept whole: vendor kernels (matmul family, convolution, attention) and fused norms that the
# codegen lowers as one reduction kernel rather than as a chain of small ops.
KEEP = frozenset({
    aten.linear.default, aten.matmul.default, aten.addmm.default, aten.mm.default,
    aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default,
    aten.native_layer_norm.default,
    aten._native_batch_norm_legit_no_training.default,
})



@torch.library.custom_op("aotc::sdpa", mutates_args=())
def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
          scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    # Argument names match ATen's schema: the graph converter maps calls back by name.
    return aten.scaled_dot_product_attention.default(query, key, value, attn_mask, dropout_p,
                                                     is_causal, scale=scale, enable_gqa=enable_gqa)


@_sdpa.register_fake
def _sdpa_fake(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


# Composite ops the dispatcher would decompose before any table is consulted, kept whole by
# tracing a mirror custom op in their place. The graph converter maps each mirror back to the
# ATen op, so plans call ATen (which picks the device's kernel) and never need aotc's library.
MIRRORS = {aten.scaled_dot_product_attention.default: torch.ops.aotc.sdpa.default}
UNMIRROR = {v: k for k, v in MIRRORS.items()}
_REPLACE = {aten.view.default: aten.reshape.default,
            aten._unsafe_view.default: aten.reshape.default, **MIRRORS}


def decomposition_table() -> dict:
    table = {op: fn for op, fn in core_aten_decompositions().items() if op not in KEEP}
    return table


class _Replay(torch.fx.Interpreter):
    """Replays an exported graph: views become reshapes, kept composites become mirrors."""

    def call_function(self, target, args, kwargs):
        return super().call_function(_REPLACE.get(target, target), args, kwargs)


def decompose(gm: torch.fx.GraphModule, flat_args: list) -> torch.fx.GraphModule:
    """Re-trace `gm` (called with `flat_args`) into aotc's core ATen op set, functionalized."""
    def replay(*args):
        return _Replay(gm).run(*args)

    functional = torch.func.functionalize(replay, remove="mutations")
    with torch.no_grad():
        traced = make_fx(functional, decomposition_table=decomposition_table(),
                         tracing_mode="fake", _allow_non_fake_inputs=True)(*flat_args)
    traced.graph.eliminate_dead_code()
    traced.recompile()
    return traced
