"""Constant folding of lazy tensors, and the attention masks it lets aotc drop."""
from __future__ import annotations

import json

import pytest
import sympy
import torch
import torch.nn.functional as F

import aotc
from aotc.codegen.constfold import UNKNOWN, constant_value, is_causal_mask
from aotc.codegen.ir import (Buffer, Op, declared_minima, index_vars, provably_nonnegative,
                             size_symbol)


class Lazy:
    def __init__(self, shape, loader, dtype=torch.bool):
        self.shape, self.loader, self.dtype = shape, loader, dtype


def idx(h, i):
    return h.index_expr(i, torch.int64)


def c(h, v):
    return h.constant(v, torch.int64)


@pytest.mark.parametrize("loader, shape, expected", [
    (lambda h, i: h.op(Op.GE, h.op(Op.ADD, idx(h, i[2]), c(h, 0)), c(h, 0)), (1, 1, 9, 9), True),
    (lambda h, i: h.op(Op.LT, idx(h, i[0]), c(h, 4)), (4,), True),
    (lambda h, i: h.op(Op.LT, idx(h, i[0]), c(h, 3)), (4,), UNKNOWN),      # false at i=3
    (lambda h, i: h.op(Op.GE, idx(h, i[0]), c(h, 4)), (4,), False),
    (lambda h, i: h.op(Op.LE, idx(h, i[0]), idx(h, i[1])), (4, 4), UNKNOWN),   # causal
    (lambda h, i: h.op(Op.LOGICAL_AND, h.op(Op.GE, idx(h, i[0]), c(h, 0)),
                       h.op(Op.LT, h.op(Op.SUB, idx(h, i[0]), c(h, 1)), c(h, 3))), (4,), True),
    (lambda h, i: h.load("x", i[0]), (4,), UNKNOWN),
    (lambda h, i: h.to_dtype(h.op(Op.GE, idx(h, i[0]), c(h, 0)), torch.float32), (4,), 1.0),
])
def test_constant_value(loader, shape, expected):
    assert constant_value(Lazy(shape, loader)) == expected if expected is not UNKNOWN \
        else constant_value(Lazy(shape, loader)) is UNKNOWN


SEQ, BATCH = size_symbol("seq"), size_symbol("batch")


def n(h, e):
    return h.index_expr(e, torch.int64)


@pytest.mark.parametrize("loader, shape, expected", [
    # traced BERT's mask: arange(seq) >= 0, expanded: all True for every seq
    (lambda h, i: h.op(Op.GE, idx(h, i[2]), c(h, 0)), (BATCH, 1, SEQ, SEQ), True),
    (lambda h, i: h.op(Op.LT, idx(h, i[0]), n(h, SEQ)), (SEQ,), True),
    (lambda h, i: h.op(Op.GE, idx(h, i[0]), n(h, SEQ)), (SEQ,), False),
    (lambda h, i: h.op(Op.LE, h.op(Op.MUL, idx(h, i[0]), n(h, SEQ)),
                       n(h, BATCH * SEQ - SEQ)), (BATCH, SEQ), True),  # batch*seq - seq >= 0
    (lambda h, i: h.op(Op.GE, idx(h, i[0]), c(h, 5)), (SEQ,), UNKNOWN),       # True from 5 on
    (lambda h, i: h.op(Op.LT, idx(h, i[0]), c(h, 2)), (SEQ,), UNKNOWN),       # all True if seq <= 2
    (lambda h, i: h.op(Op.LT, idx(h, i[0]), n(h, SEQ - 1)), (SEQ,), UNKNOWN),  # not the last
    (lambda h, i: h.op(Op.LT, idx(h, i[0]), n(h, BATCH)), (SEQ,), UNKNOWN),   # another size
])
def test_constant_value_over_symbolic_sizes(loader, shape, expected):
    """With a dim of symbolic size n, index c ranges over [0, n - 1]: a comparison is decided
    only where it holds (or fails) for every n >= 1, else nothing is proved."""
    value = constant_value(Lazy(shape, loader))
    assert value is expected if expected is UNKNOWN else value == expected


@pytest.mark.parametrize("make, causal", [
    (lambda h, i: h.op(Op.LE, idx(h, i[3]), idx(h, i[2])), True),              # j <= i
    (lambda h, i: h.op(Op.LE, h.op(Op.SUB, idx(h, i[3]), c(h, 1)),
                       h.op(Op.SUB, idx(h, i[2]), c(h, 1))), True),
    (lambda h, i: h.op(Op.LT, idx(h, i[3]), idx(h, i[2])), False),             # strict
    (lambda h, i: h.op(Op.LOGICAL_AND, h.op(Op.LE, idx(h, i[3]), idx(h, i[2])),
                       h.op(Op.LT, idx(h, i[3]), c(h, 4))), False),             # a window
    (lambda h, i: h.op(Op.LOGICAL_AND, h.op(Op.LE, idx(h, i[3]), idx(h, i[2])),
                       h.op(Op.LT, idx(h, i[3]), n(h, SEQ))), True),            # j < seq: always
])
def test_causal_mask_over_symbolic_sizes(make, causal):
    assert is_causal_mask(Lazy((BATCH, 1, SEQ, SEQ), make), {}) == causal


def test_loads_followed_into_a_buffer_with_symbolic_strides():
    """GPT-2's position ids with one prepended, pos = cat([p[:1] - 1, p]) of shape
    (batch, seq + 1), are realized; `pos[:, 1:] - pos[:, :-1] == 1` reads it at offsets 1 and
    0 along a row of stride seq + 1. A read that may leave the row proves nothing."""
    buf = Buffer(name="buf0", slot=0, shape=(BATCH, SEQ + 1), stride=(SEQ + 1, 1),
                 dtype=torch.int64)
    bodies = {"buf0": (buf, lambda h, i: h.op(Op.SUB, idx(h, i[1]), c(h, 1)))}

    def step(offset):
        def loader(h, i):
            row = i[0] * (SEQ + 1)
            return h.op(Op.EQ, h.op(Op.SUB, h.load("buf0", row + i[1] + offset),
                                    h.load("buf0", row + i[1])), c(h, offset))
        return loader
    assert constant_value(Lazy((BATCH, SEQ), step(1)), bodies) is True
    assert constant_value(Lazy((BATCH, SEQ), step(2)), bodies) is UNKNOWN   # reads past a row


@pytest.mark.parametrize("expr, nonnegative", [
    (SEQ - 1, True), (SEQ - 2, False), (BATCH * SEQ - SEQ, True), (SEQ - BATCH, False),
    (index_vars("c", 1)[0] * (SEQ + 1), True), (-SEQ, False), (3, True), (-1, False),
    (sympy.Symbol("indirect", integer=True), False),
])
def test_provably_nonnegative(expr, nonnegative):
    """A proof for every size >= 1 and loop index >= 0, never a guess."""
    assert provably_nonnegative(expr) == nonnegative


@pytest.mark.parametrize("seq_min, batch_min, expr, nonnegative", [
    (3, 1, SEQ - 3, True), (2, 1, SEQ - 3, False), (4, 2, SEQ * BATCH - 8, True),
    (4, 1, SEQ * BATCH - 8, False), (0, 1, SEQ - 1, True), (5, 1, SEQ - BATCH, False),
])
def test_proofs_use_declared_minima(seq_min, batch_min, expr, nonnegative):
    """Inside `declared_minima` a size is at least its declared minimum (the guards enforce
    it; a minimum below 1 counts as 1); outside, the proof falls back to sizes >= 1."""
    with declared_minima({"seq": {"min": seq_min}, "batch": {"min": batch_min}}):
        assert provably_nonnegative(expr) == nonnegative
    if nonnegative and (seq_min > 1 or batch_min > 1):
        assert not provably_nonnegative(expr)


class Attention(torch.nn.Module):
    """SDPA with the mask `make_mask(Lq, Lk)` builds inside the model (as traced code does)."""

    def __init__(self, make_mask):
        super().__init__()
        self.make_mask = make_mask

    def forward(self, q, k, v):
        mask = self.make_mask(q.shape[2], k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def export_attention(tmp_path, make_mask, q_len: int = 6) -> dict:
    """The plan's one SDPA step, for a model built around `make_mask`; the artifact's output
    is checked against eager on the way."""
    q, k, v = torch.randn(2, 4, q_len, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    model = Attention(make_mask)
    path = aotc.export(model, (q, k, v), tmp_path / "a.aotc")
    torch.testing.assert_close(aotc.load(path)(q, k, v), model(q, k, v))
    plan = json.loads((path / "plans/forward.json").read_text())
    step, = [s for s in plan["steps"]
             if s["kind"] == "extern" and "scaled_dot_product" in s["op"]]
    return step


def is_causal(step: dict) -> bool:
    return step["args"][5] if len(step["args"]) > 5 else step["kwargs"].get("is_causal", False)


@pytest.mark.parametrize("make_mask, dropped", [
    (lambda n, m: (torch.arange(n) >= 0)[None, None, :, None].expand(2, 1, n, m), True),
    (lambda n, m: torch.zeros(n, m), True),                                 # additive, all 0
    (lambda n, m: (torch.arange(m) < m - 1)[None, None, None, :].expand(2, 1, n, m), False),
    (lambda n, m: torch.ones(n, m, dtype=torch.bool).triu(), False),
])
def test_sdpa_drops_a_mask_that_masks_nothing(tmp_path, make_mask, dropped):
    """A traced model's all-True (or all-zero additive) attention mask is dropped, so SDPA may
    pick a flash kernel; a mask that masks something is kept; results match eager."""
    step = export_attention(tmp_path, make_mask)
    assert (step["args"][3] is None) == dropped and not is_causal(step)


@pytest.mark.parametrize("make_mask, causal", [
    (lambda n, m: torch.ones(n, m, dtype=torch.bool).tril(), True),
    (lambda n, m: (torch.arange(m)[None, :] <= torch.arange(n)[:, None])[None, None]
     .expand(2, 1, n, m), True),
    (lambda n, m: torch.arange(m)[None, :] < torch.arange(n)[:, None], False),    # strict
    (lambda n, m: torch.arange(m)[None, :] >= torch.arange(n)[:, None], False),   # upper
])
def test_sdpa_takes_a_causal_mask_as_is_causal(tmp_path, make_mask, causal):
    """A mask proved to be `j <= i` becomes is_causal=True (flash kernels); results match."""
    step = export_attention(tmp_path, make_mask)
    assert (step["args"][3] is None) == causal and is_causal(step) == causal


def test_causal_mask_needs_equal_lengths(tmp_path):
    """With fewer queries than keys, `j <= i` is not SDPA's is_causal: the mask stays."""
    step = export_attention(
        tmp_path, lambda n, m: torch.arange(m)[None, :] <= torch.arange(n)[:, None], q_len=3)
    assert step["args"][3] is not None and not is_causal(step)


def _packed_causal_mask(n: int, m: int) -> torch.Tensor:
    """The mask traced transformers (GPT-2, LLaMA) build with no padding: causal, and within
    one packed sequence, whose ids are the cumsum of where position ids do not step by one."""
    pos = torch.arange(m)[None]
    step = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
    packed = (step != 1).cumsum(-1)
    causal = torch.arange(m)[None, :] <= torch.arange(n)[:, None]
    return causal[None, None] & (packed[:, None, :n, None] == packed[:, None, None, :])


def test_packed_sequence_mask_is_causal(tmp_path):
    """Proving it needs the case split of `cat` (position ids less one, read from two parts),
    the cumsum of a constant (no packing: all 0) and loads followed into computed buffers."""
    step = export_attention(tmp_path, _packed_causal_mask)
    assert step["args"][3] is None and is_causal(step)


def test_cumsum_of_a_constant_is_inlined(tmp_path):
    """cumsum of a provable constant c is c * (position + 1), inlined; of anything else, ATen's."""
    class Count(torch.nn.Module):
        def forward(self, x):
            twos = torch.full((x.shape[0], x.shape[1]), 2, dtype=torch.int64)
            return (x + (torch.arange(x.shape[1])[None] >= 0).cumsum(-1) + twos.cumsum(1)
                    + (x > 0).cumsum(0))
    x = torch.randn(3, 5)
    path = aotc.export(Count(), (x,), tmp_path / "c.aotc")
    plan = json.loads((path / "plans/forward.json").read_text())
    externs = [s["op"] for s in plan["steps"] if s["kind"] == "extern"]
    assert externs.count("aten::cumsum.default") == 1        # (x > 0).cumsum(0) only
    torch.testing.assert_close(aotc.load(path)(x), Count()(x))


def test_select_of_cat_parts_that_agree():
    """cat([arange(n)[:1] - 1, arange(n)]) is arange(n + 1) - 1 at every position."""
    def loader(h, i):
        k = h.index_expr(i[0], torch.int64)
        part0 = h.op(Op.SUB, h.index_expr(i[0], torch.int64), c(h, 1))      # read below 1
        part1 = h.op(Op.SUB, k, c(h, 1))                                    # arange at k - 1
        inner = h.masked(h.op(Op.GE, k, c(h, 1)), lambda: part1, 0, torch.int64)
        value = h.masked(h.op(Op.LT, k, c(h, 1)), lambda: part0, inner, torch.int64)
        return h.op(Op.NE, h.op(Op.SUB, h.op(Op.ADD, value, c(h, 1)), value), c(h, 1))
    assert constant_value(Lazy((9,), loader)) is False


@pytest.mark.parametrize("name, causal", [("gpt2", True), ("bert", False)])
def test_transformers_attention_masks(tmp_path, name, causal):
    """Traced without padding, GPT-2's mask is proved causal and BERT's all True: every
    attention call of the plan runs maskless (is_causal for GPT-2), matching eager."""
    pytest.importorskip("transformers")
    from conftest import SAMPLES_DIR, import_file
    torch.manual_seed(0)
    model = getattr(import_file(SAMPLES_DIR / "hf_models.py"), name)().eval()
    x = torch.randint(0, 1000, (2, 16))
    path = aotc.export(model, (x,), tmp_path / f"{name}.aotc")
    plan = json.loads((path / "plans/forward.json").read_text())
    steps = [s for s in plan["steps"]
             if s["kind"] == "extern" and "scaled_dot_product" in s["op"]]
    assert len(steps) == 2 and all(s["args"][3] is None and is_causal(s) == causal
                                   for s in steps)
    written = {plan["slots"][o]["dtype"] for s in plan["steps"] if s["kind"] == "kernel"
               for o in s["out"]}
    assert written == {"float32"}     # the mask, once SDPA takes none, is not computed
    got, want = aotc.load(path)(x), model(x)
    torch.testing.assert_close(got["last_hidden_state"], want.last_hidden_state,
                               rtol=1e-4, atol=1e-4)
