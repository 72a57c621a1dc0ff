"""Selecting before computing: a `select` of a graph's result along a dim that the ops before it
treat row by row is moved in front of them, so they compute only the selected rows.

The case that matters is a decoder's prefill, which returns the logits of the last position
(`logits[:, -1]`) of a head computed over every position: `linear(h, W_vocab)` over [B, T, V]
is most of a prefill's work at short prompts (a LLaMA-style 4-layer, 256-wide decoder with a
32000-word vocabulary spends about 70% of its multiply-adds in it) and writes a [B, T, V]
tensor. The same holds for any model that reads one row of a per-row op's result (a BERT
classifier over the CLS position). The rewrite is exact: the moved select picks the same
elements, and every op it passes computes each row from that row alone:

  linear(x, W, b)              rows are every dim but the last
  layer_norm(x, shape, ...)    rows are the dims before `shape`
  alias, dropout, clone, contiguous, to(dtype), pointwise ops of one tensor
  view / reshape               only where the output's sizes equal the input's (a no-op view)

A select moves only through an op whose result nothing else reads (else both would be
computed), and stops at the first op it cannot pass.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

SAME_SHAPE = {aten.alias.default, aten.dropout.default, aten.clone.default,
              aten.contiguous.default, aten.to.dtype, aten.type_as.default, aten.gelu.default,
              aten.relu.default, aten.silu.default, aten.tanh.default, aten.sigmoid.default}
VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(str(d) for d in val.shape) if isinstance(val, torch.Tensor) else None


def _row_dim(node, dim: int) -> bool:
    """Whether `node`'s op computes each index of `dim` (of its output) from that index of its
    first input alone, with the other inputs broadcast unchanged."""
    shape = _shape(node)
    if shape is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    rank, src = len(shape), _shape(node.args[0])
    dim = dim % rank if rank else dim
    if node.target is aten.linear.default:
        return dim < rank - 1
    if node.target is aten.layer_norm.default:
        return dim < rank - len(node.args[1])
    if node.target is aten.dropout.default and (len(node.args) < 3 or node.args[2]):
        return False             # a training dropout: its mask would be drawn differently
    if node.target in SAME_SHAPE:
        others = [a for a in (*node.args[1:], *node.kwargs.values())
                  if isinstance(a, torch.fx.Node)]
        return src == shape and (node.target is aten.type_as.default or not others)
    if node.target in VIEWS:
        return src == shape
    return False


def with_selects_pushed(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` (the same attributes, a new graph) with `push_selects` applied, or `gm`
    itself where no select moves."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = torch.fx.GraphModule(gm, graph)
    return copy if push_selects(copy) else gm


def push_selects(gm: torch.fx.GraphModule) -> int:
    """Move each `aten.select.int` of `gm` as far before the row-wise ops it reads as it goes;
    returns how many ops it passed in all."""
    moved = 0
    for sel in [n for n in gm.graph.nodes if n.target is aten.select.int]:
        while True:
            src, dim, index = sel.args
            if not isinstance(src, torch.fx.Node) or len(src.users) != 1 or \
                    not _row_dim(src, dim):
                break
            rank = len(_shape(src))
            dim = dim % rank
            with gm.graph.inserting_before(src):
                inner = gm.graph.call_function(aten.select.int, (src.args[0], dim, index))
            inner.meta = dict(sel.meta)   # (the re-trace recomputes values)
            new_args = (inner, *src.args[1:])
            if src.target in VIEWS:      # a no-op view: the selected input is the result
                sel.replace_all_uses_with(inner)
            else:
                with gm.graph.inserting_after(src):
                    out = gm.graph.call_function(src.target, new_args, dict(src.kwargs))
                out.meta = dict(src.meta)
                sel.replace_all_uses_with(out)
            gm.graph.erase_node(sel)
            gm.graph.erase_node(src)
            moved += 1
            sel = inner
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved
