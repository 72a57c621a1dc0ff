"""Selects moved before row-wise ops (exporter/selects.py): a prefill's last-position logits
computed from one row of the head, exactly; nothing moved where it would change a value or
compute something twice."""
from __future__ import annotations

import torch
from torch import nn

import aotc
from aotc.exporter.selects import push_selects, with_selects_pushed

aten = torch.ops.aten


class Head(nn.Module):
    """GPT-2's tail: layer norm, a no-op view, an alias-like dropout, the vocab projection, and
    the last position's logits."""

    def __init__(self, dim=16, vocab=40, index=-1, dim_sel=1, reuse=False):
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(dim), nn.Linear(dim, vocab)
        self.drop = nn.Dropout(0.1)
        self.index, self.dim_sel, self.reuse = index, dim_sel, reuse

    def forward(self, h):
        x = self.drop(self.norm(h).view(h.shape[0], h.shape[1], -1))
        logits = self.proj(torch.relu(x))
        out = logits.select(self.dim_sel, self.index)
        return (out, logits.sum()) if self.reuse else out


def _graph(model, x):
    return torch.export.export(model.eval(), (x,)).module()


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_the_head_runs_on_the_selected_row_only():
    model, x = Head(), torch.randn(2, 7, 16)
    gm = _graph(model, x)
    moved = push_selects(gm)
    assert moved >= 3                       # linear, relu, dropout, view, layer_norm
    ops = _ops(gm)
    assert ops.index(aten.select.int) < ops.index(aten.linear.default)
    sel = next(n for n in gm.graph.nodes if n.target is aten.select.int)
    assert tuple(sel.args[0].meta["val"].shape) == (2, 7, 16)     # of the head's input
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=1e-6)


def test_nothing_moves_where_it_would_change_or_repeat_work():
    x = torch.randn(2, 7, 16)
    for model in (Head(dim_sel=2, index=3),      # the linear's own output dim
                  Head(reuse=True)):             # the logits are read again
        gm = _graph(model, x)
        before = _ops(gm)
        assert push_selects(gm) == 0 and _ops(gm) == before
    train = Head().train()
    gm = torch.export.export(train, (x,)).module()
    push_selects(gm)                              # may pass the linear, not the dropout
    sel = next(n for n in gm.graph.nodes if n.target is aten.select.int)
    assert sel.args[0].target is not aten.layer_norm.default


def test_the_copy_leaves_the_exported_graph_alone():
    x = torch.randn(2, 7, 16)
    gm = _graph(Head(), x)
    before = _ops(gm)
    assert with_selects_pushed(gm) is not gm and _ops(gm) == before


def test_exported_artifact_matches_eager(tmp_path):
    model, x = Head().eval(), torch.randn(3, 9, 16)
    m = aotc.load(aotc.export(model, (x,), tmp_path / "h.aotc"))
    torch.testing.assert_close(m(x), model(x), rtol=1e-5, atol=1e-5)
