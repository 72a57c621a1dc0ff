"""The CUDA decode-attention kernels (codegen/triton/decode_attention.py: split over chunks of
the cache, then combined), run by Triton's interpreter, against attention over exactly the keys
they must read; the cache holds NaN everywhere else, so a kernel that reads one key too many
fails. With `write`, the split kernel first writes this step's key and value at the position
(the cache held NaN there) and attends with them; head sizes need not be powers of two, and
values may have their own (multi-head latent attention); with a window, only the last `window`
positions count; with a softcap, scores are soft-capped; with sinks, each head's softmax has
one more logit. In bf16 the reference is float32 attention of the same bf16 values."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from aotc.artifact.schema.plan import CallStep, FreeStep, SlotRef
from aotc.artifact.schema.types import StepKind
from aotc.runtime.attention import attention


def _check(batch, heads, kv_heads, max_len, pos, write, dtype, window=0, softcap=0.0,
           sinks=False, d=16, dv=None, early=None, prologue=None, key=False):
    """`prologue` (rows of a table): q (and with `key` the new key) computed by the split
    kernel, as raw * table[pos] (an index checked against the table's rows), from buffers raw
    and table (a weight); returns the error flag."""
    pytest.importorskip("triton")
    from aotc.codegen.ir import Buffer, contiguous_strides, sym
    from aotc.codegen.triton import module_text
    from aotc.codegen.triton.decode_attention import decode_attention_kernels, partial_shapes
    from aotc.runtime.interpret import mended_bf16, import_kernel
    g = torch.Generator().manual_seed(pos)
    dv = dv or d
    q = torch.randn(batch, heads, 1, d, generator=g).to(dtype)
    k, v = (torch.randn(batch, kv_heads, max_len, n, generator=g).to(dtype) for n in (d, dv))
    new = [torch.randn(batch, kv_heads, 1, n, generator=g).to(dtype) for n in (d, dv)]
    if prologue:
        raw = [torch.randn(batch, n, 1, d, generator=g).to(dtype) for n in (heads, kv_heads)]
        table = torch.randn(prologue, d, generator=g).to(dtype)
        q, kn = ((r.float() * table[min(pos, prologue - 1)].float()).to(dtype) for r in raw)
        new[0] = kn if key else new[0]
    want_k, want_v = k.clone(), v.clone()
    if write:
        want_k[:, :, pos], want_v[:, :, pos] = new[0][:, :, 0], new[1][:, :, 0]
        k[:, :, pos] = v[:, :, pos] = float("nan")
    lo = max(0, pos + 1 - window) if window else 0
    for t in (k, v):
        t[:, :, pos + 1:] = float("nan")
        t[:, :, :lo] = float("nan")
    position = torch.tensor([pos])
    sink = (torch.randn(heads, generator=g) * 3).to(dtype) if sinks else None
    buf = lambda i, t: Buffer(name=f"buf{i}", slot=i, shape=tuple(map(sym, t.shape)),  # noqa
                              stride=contiguous_strides(tuple(map(sym, t.shape))), dtype=t.dtype)
    qb, kb, vb, pb = (buf(i, t) for i, t in enumerate((q, k, v, position)))
    tensors = {"buf0": q, "buf1": k, "buf2": v, "buf3": position}
    extra = tuple(new) if write else ()
    nbufs = tuple(buf(8 + i, t) for i, t in enumerate(extra))
    if prologue:
        tb = dataclasses.replace(buf(12, table), constant=True)
        qb, computed_key, buffers = _prologue(raw, [buf(11, raw[0]), buf(13, raw[1])], tb, pb)
        nbufs = (computed_key, *nbufs[1:]) if key and write else nbufs
        tensors.update(buf11=raw[0], buf12=table, buf13=raw[1])
    # NaN where no program stores: the combine reads the chunks up to the position only
    parts = [torch.full(s, float("nan")) for s in partial_shapes(q, kb, vb)]
    pbufs = [buf(4 + i, t) for i, t in enumerate(parts)]
    out = torch.empty(batch, heads, 1, dv, dtype=dtype)
    split, combine = decode_attention_kernels(
        qb, kb, vb, pb, pbufs, buf(7, out), 0.25, nbufs, window=window, softcap=softcap,
        sinks=buf(10, sink) if sinks else None, early=write if early is None else early)
    tensors.update({f"buf{8 + i}": t for i, t in enumerate(extra)})
    tensors.update({b.name: t for b, t in zip((*pbufs, buf(7, out)), (*parts, out))})
    tensors["aotc_err"] = torch.zeros(1, dtype=torch.int32)
    if sinks:
        tensors["buf10"] = sink
    for hk, name in ((split, "kernel0"), (combine, "kernel1")):
        hk.name = name
        ks = hk.source(buffers, 7) if prologue else hk.source()
        fn = import_kernel(module_text(ks), name, f"{name}.py")
        with mended_bf16():
            fn[tuple(int(x) for x in ks.grid)](*(tensors[n] for n in ks.signature))
    if prologue and pos >= prologue:
        return tensors["aotc_err"]
    want = attention(q.float(), want_k[:, :, lo:pos + 1].float(),
                     want_v[:, :, lo:pos + 1].float(), None, 0.25, softcap,
                     sinks=sink.float() if sinks else None)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol)
    if write:   # the cache holds the new row now, and the rest as it was
        torch.testing.assert_close(k[:, :, lo:pos + 1], want_k[:, :, lo:pos + 1])
        torch.testing.assert_close(v[:, :, lo:pos + 1], want_v[:, :, lo:pos + 1])
    return tensors["aotc_err"]


def _prologue(raw, raw_bufs, tb, pb):
    """Prologues computing raw * table[pos] over each raw's shape (q's, the key's), and the
    buffers they read."""
    import sympy

    from aotc.codegen.ir import Op
    from aotc.codegen.triton.prologue import make_prologue

    def loader(rb, rows, d):
        def load(h, idx):
            b, r, _, j = idx
            x = h.load(rb.name, b * rows * d + r * d + j)
            p = h.indirect(h.load(pb.name, sympy.Integer(0)), int(tb.shape[0]), wraps=False,
                           op="aten::embedding.default")
            return h.op(Op.MUL, x, h.load(tb.name, p * d + j))
        return load
    made = [make_prologue(f"prologue_{role}", t.shape, t.dtype, loader(b, t.shape[1], t.shape[3]))
            for role, t, b in zip("qk", raw, raw_bufs)]
    return (*made, {b.name: b for b in (*raw_bufs, tb, pb)})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("key,write,d,early", [
    (True, True, 16, True), (True, True, 12, True), (False, True, 80, True),
    (True, True, 16, False), (False, False, 16, None)])
def test_a_computed_q_and_key_are_computed_by_the_split_kernel(key, write, d, early, dtype):
    """Prologues (codegen/triton/prologue.py): q, and the new key, computed where the split
    kernel loaded them (heads padded to 16 rows, dims below and above a power of two masked),
    their position and table rows before the wait where the kernel reads early, equal to
    attention over the values a kernel of their own would store."""
    err = _check(2, 4, 2, 96, 70, write, dtype, d=d, key=key, prologue=128, early=early)
    assert int(err[0]) == 0


def test_a_prologue_index_out_of_range_stores_the_kernels_error_code():
    """The prologue's index checks are the split kernel's: a position past the table flags its
    code (and reads row 0 instead: no address outside the table)."""
    err = _check(1, 4, 2, 96, 70, True, torch.float32, key=True, prologue=50)
    assert int(err[0]) == 7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
@pytest.mark.parametrize("batch,heads,kv_heads,max_len,pos", [
    (1, 4, 2, 96, 70), (2, 4, 4, 64, 0), (2, 8, 2, 200, 199), (1, 2, 1, 40, 33)])
def test_flash_decoding_kernels_match_attention_over_the_prefix(batch, heads, kv_heads, max_len,
                                                                pos, write, dtype):
    _check(batch, heads, kv_heads, max_len, pos, write, dtype)


@pytest.mark.parametrize("pos", [0, 70, 95])
def test_the_split_kernel_waiting_first_where_the_step_writes_the_cache_before(pos):
    """A writing attention whose cache another kernel of the step may write first reads
    nothing before the PDL wait; the loop is the same."""
    _check(1, 4, 2, 96, pos, True, torch.float32, early=False)


def test_early_kernels_read_the_cache_and_position_before_the_wait():
    from aotc.codegen.ir import Buffer, contiguous_strides, sym
    from aotc.codegen.triton.decode_attention import decode_attention_kernels
    buf = lambda i, shape, dt=torch.bfloat16: Buffer(  # noqa: E731
        name=f"buf{i}", slot=i, shape=tuple(map(sym, shape)),
        stride=contiguous_strides(tuple(map(sym, shape))), dtype=dt)
    args = (buf(0, (1, 4, 1, 16)), buf(1, (1, 2, 64, 16)), buf(2, (1, 2, 64, 16)),
            buf(3, (1,), torch.int64), [buf(4, (4, 16), torch.float32),
                                        buf(5, (4,), torch.float32), buf(6, (4,), torch.float32)],
            buf(7, (1, 4, 1, 16)), 0.25, (buf(8, (1, 2, 1, 16)), buf(9, (1, 2, 1, 16))))
    for early in (False, True):
        for hk in decode_attention_kernels(*args, early=early):
            text = hk.source().text
            body = text[text.index("):\n") + 3:]
            wait = body.index("gdc_wait()")
            assert (body.index("tl.load(buf3)") < wait) == early, (hk.name, early)
            assert (body.index("gdc_launch_dependents()") < wait) == early
    for hk in decode_attention_kernels(*args[:-1], early=True):   # reads only: never early
        body = hk.source().text
        assert body.index("gdc_wait()") < body.index("tl.load(buf3)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
@pytest.mark.parametrize("window,softcap,pos", [
    (8, 0.0, 70),       # the window starts inside a block of the chunk before the position's
    (64, 0.0, 150),     # whole chunks before the window skipped
    (200, 0.0, 33),     # a window longer than the prefix: every key
    (1, 0.0, 99),       # the position's own key alone
    (0, 5.0, 70),       # scores soft-capped (Gemma 2), no window
    (20, 2.0, 130)])    # both
def test_flash_decoding_kernels_with_a_window_and_a_softcap(window, softcap, pos, write, dtype):
    _check(2, 4, 2, 200, pos, write, dtype, window, softcap)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window,pos", [(0, 0), (0, 150), (8, 70)])
def test_flash_decoding_kernels_with_attention_sinks(window, pos, dtype):
    """GPT-OSS's sinks: a logit per head (large ones here, so they take real weight) joins the
    softmax in the combine kernel, at the first position and across chunks."""
    _check(2, 8, 2, 200, pos, True, dtype, window, sinks=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("batch,heads,kv_heads,pos,window,d", [
    (1, 4, 2, 70, 0, 16), (2, 8, 2, 199, 0, 16), (2, 4, 4, 0, 0, 16), (3, 6, 2, 130, 20, 24)])
def test_computed_q_and_key_at_any_batch_and_head_count(batch, heads, kv_heads, pos, window, d,
                                                        dtype):
    """Computed q and key (a rotary embedding of each) read each sequence's query heads and
    its key from their own rows, at every batch and head count, with a window too."""
    _check(batch, heads, kv_heads, 200, pos, True, dtype, window, d=d, key=True, prologue=256)


# ------------------------------------------------------------- hostile plans calling the op
FIXTURE = __import__("pathlib").Path(__file__).parent / "fixtures" / "format_v12_generator.aotc"


def _decode_step(doc):
    return next(s for s in doc["steps"] if s.get("op") == "aotc::decode_attention_write.default")


@pytest.mark.parametrize("runner", ["cpp", "python"])
@pytest.mark.parametrize("edit,message", [
    (lambda s: s["args"].__setitem__(7, "4"), "argument 7: an int"),             # the window
    (lambda s: s["args"].__setitem__(7, 4.5), "argument 7: an int"),
    (lambda s: s["args"].__setitem__(8, {"slot": 5}), "argument 8: a number"),   # the softcap
    (lambda s: s["args"].__setitem__(9, 1.0), "argument 9: a tensor slot"),      # the sinks
    (lambda s: s["args"].append(0), "7-10 positional arguments"),
    (lambda s: s["args"].__delitem__(slice(5, None)), "7-10 positional arguments")])
def test_decode_attention_arguments_are_checked_at_load(tmp_path, runner, edit, message):
    """Each argument of aotc's own op has a kind (runtime/aotc_ops.py's OPS): a plan that gives
    another is refused when the artifact loads, not when a decode step runs."""
    import aotc
    from aotc.errors import ArtifactError
    from hostile import copy_artifact, edit_json
    art = copy_artifact(FIXTURE, tmp_path / "g.aotc")
    edit_json(art, "plans/decode.json", lambda doc: edit(_decode_step(doc)))
    with pytest.raises(ArtifactError, match=message):
        aotc.load(art, runner=runner)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
@pytest.mark.parametrize("d,dv,window", [
    (80, 80, 0),        # Phi-2's head size: padded to 128 in registers
    (96, 96, 8),        # Phi-3-mini's, with a window
    (24, 16, 0),        # keys and values of different sizes (multi-head latent attention)
    (12, 40, 0)])       # both below and above a power of two, keys narrower than tl.dot's 16
def test_flash_decoding_kernels_with_any_head_sizes(d, dv, window, write, dtype):
    _check(2, 4, 2, 96, 70, write, dtype, window=window, d=d, dv=dv)


def test_a_cuda_generator_at_batch_2_decodes_through_the_interpreter(tmp_path):
    """The LLaMA sample exported for CUDA at batch 2 (its rotary q and new key computed by the
    attention's split kernel itself, never stored: no kernel of their own; attention over 3
    chunks of the cache) generates what its CPU artifact does through Triton's interpreter,
    and again after a reset."""
    pytest.importorskip("triton")
    import json

    import aotc
    from conftest import llama_sample
    m = llama_sample(vocab=256)
    ids = torch.randint(1, 255, (2, 5), generator=torch.Generator().manual_seed(3))
    path = aotc.export(m, (ids,), tmp_path / "g.aotc", decode=True, max_cache_len=160,
                       target="cuda:sm_90")
    slots = json.loads((path / "plans" / "decode.json").read_text())["slots"]
    assert [2, 4 + 2, 1, 16] not in [s.get("shape") for s in slots]   # q's heads, the key's
    splits = [p for p in (path / "kernels").glob("decode_*.py")
              if all(f"    {v} = " in p.read_text() for v in ("q_value", "key_value"))]
    assert len(splits) == 2            # one split kernel a layer computes them
    want = aotc.load(aotc.export(m, (ids,), tmp_path / "c.aotc", decode=True,
                                 max_cache_len=160)).generate(ids, 6)
    gen = aotc.load(path, device="cpu", interpret=True)
    assert torch.equal(gen.generate(ids, 6), want)
    gen.reset()
    assert torch.equal(gen.generate(ids, 6), want)


def test_a_state_slot_is_written_before_by_kernels_views_and_extern_calls():
    """The proof behind `early`: a slot counts as written by a step before the attention if a
    kernel stores into it (in place too: an earlier writing attention's caches), or an extern
    call names it or a view of it; reads by kernels and frees do not count."""
    from aotc.codegen.ir import Buffer, contiguous_strides, sym
    from aotc.codegen.lowering.decode import written_before
    from aotc.codegen.triton.decode_attention import decode_attention_kernels
    buf = lambda i, shape, dt=torch.bfloat16: Buffer(  # noqa: E731
        name=f"buf{i}", slot=i, shape=tuple(map(sym, shape)),
        stride=contiguous_strides(tuple(map(sym, shape))), dtype=dt)
    f32 = torch.float32
    kernels = decode_attention_kernels(
        buf(0, (1, 4, 1, 16)), buf(1, (1, 2, 64, 16)), buf(2, (1, 2, 64, 16)),
        buf(3, (1,), torch.int64), [buf(4, (4, 16), f32), buf(5, (4,), f32), buf(6, (4,), f32)],
        buf(7, (1, 4, 1, 16)), 0.25, (buf(8, (1, 2, 1, 16)), buf(9, (1, 2, 1, 16))), early=True)
    assert written_before(kernels, {1}) and written_before(kernels, {2})   # the cache writes
    assert not written_before(kernels, {3}) and not written_before(kernels, {11})
    copy = CallStep(kind=StepKind.EXTERN, op="aten::copy_.default",
                    args=(SlotRef(3), SlotRef(12)), kwargs=(), out=(None,))
    assert written_before([copy], {3})
    view = CallStep(kind=StepKind.VIEW, op="aten::slice.Tensor", args=(SlotRef(1), 0),
                    kwargs=(), out=(20,))
    call = dataclasses.replace(copy, args=(SlotRef(20), SlotRef(12)))
    assert written_before([view, call], {1}) and not written_before([view], {1})
    assert not written_before([FreeStep(slots=(3,))], {3})


def test_early_reads_need_an_extern_step_after_the_last_write_of_the_state():
    """Across runs, what the kernels read before the wait must have been written before an
    extern step (launched without PDL) of the run before: without one, or with a write of the
    position after it, both kernels wait first."""
    from aotc.codegen.ir import Buffer, contiguous_strides, sym
    from aotc.codegen.lowering.decode import fence_early_reads
    from aotc.codegen.triton.decode_attention import decode_attention_kernels
    buf = lambda i, shape, dt=torch.bfloat16: Buffer(  # noqa: E731
        name=f"buf{i}", slot=i, shape=tuple(map(sym, shape)),
        stride=contiguous_strides(tuple(map(sym, shape))), dtype=dt)
    f32 = torch.float32

    def pair():
        return decode_attention_kernels(
            buf(0, (1, 4, 1, 16)), buf(1, (1, 2, 64, 16)), buf(2, (1, 2, 64, 16)),
            buf(3, (1,), torch.int64), [buf(4, (4, 16), f32), buf(5, (4,), f32),
                                        buf(6, (4,), f32)],
            buf(7, (1, 4, 1, 16)), 0.25, (buf(8, (1, 2, 1, 16)), buf(9, (1, 2, 1, 16))),
            early=True)
    write_back = CallStep(kind=StepKind.EXTERN, op="aten::copy_.default", out=(None,),
                          kwargs=(), args=(SlotRef(3), SlotRef(12)))
    other = dataclasses.replace(write_back, args=(SlotRef(20), SlotRef(21)))
    from aotc.codegen.triton.decode_attention import HandKernel
    q_writer = HandKernel(name="q", prefix=(), outs=(buf(0, (1, 4, 1, 16)),))  # not read early
    for tail, kept in (([write_back], True), ([], False), ([write_back, *pair()], None),
                       ([other], True), ([write_back, q_writer], True)):
        kernels = pair()
        decisions = fence_early_reads([*kernels, *tail])
        if kept is None:     # the pair after the write-back waits; the first pair too
            kept = False
        assert [k.early for k in kernels] == [kept, kept], tail
        assert all(("before the PDL wait" in d) == kept for d in decisions[:2])
        text = kernels[0].source().text
        assert (text.index("tl.load(buf3)") < text.index("gdc_wait()")) == kept
