"""Decode attention for CUDA artifacts: a flash-decoding kernel pair, written by hand.

`aotc::decode_attention(q [B, H, 1, D], k_cache [B, Hkv, M, D], v_cache [B, Hkv, M, Dv],
pos [1], scale)` reads keys 0..pos of a static cache. At one query token per sequence, decode
is bound by memory: what matters is reading each valid key and value once, with the whole GPU,
and nothing past the position. So the keys are split into short chunks over a fixed grid
(B * Hkv programs per chunk, `plan_splits`), each program computing, for the query heads that
share its KV head, a partial softmax (max, sum) and weighted sum of its chunk; its loop stops
at the position, so a chunk past it costs a program that stores nothing, and short contexts
cost little. A second kernel combines the partials of the chunks up to the position. Head sizes of any width
(80, 96, multi-head latent attention's 192 for keys and 128 for values) are padded to a power
of two in registers and masked. Like generated kernels, these call only Triton builtins and
the prelude's helpers (codegen/triton/printer.py says why), so the interpreter runs them too.
The grid and every size are static, so decode replays as one CUDA graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from aotc.codegen.scheduler import Kernel
from aotc.codegen.triton.build import hoist_early

BLOCK_N = 32
CHUNK = 2 * BLOCK_N            # keys per program
MAX_SPLITS = 128               # chunks per sequence and KV head at most (the combine's block)


@dataclass
class HandKernel(Kernel):
    """A kernel written by hand rather than from loop IR: it reads and writes whole buffers
    (`ins`, `outs`: Buffers) and brings its own Triton source."""
    ins: tuple = ()
    outs: tuple = ()
    make: object = None       # (name, ins, outs) -> KernelSource
    mutates: tuple = ()       # of `ins`, those it writes in place (the caches it writes)
    early: bool = False       # reads `read_early` before the PDL wait
    read_early: tuple = ()    # of `ins`, those it may read before the wait (position, caches)
    prologues: tuple = ()     # (role, Prologue): values it computes instead of loading them

    def __post_init__(self):
        if self.prologues:    # their index checks become the kernel's plan checks
            self.nodes = [p.node for _, p in self.prologues]

    @property
    def writes(self) -> list:
        return list(self.outs)

    @property
    def reads(self) -> set[str]:
        return {b.name for b in self.ins} | {n for _, p in self.prologues for n in p.reads}

    def source(self, buffers: dict | None = None, error_code: int = 1):
        """The KernelSource; one with prologues needs the buffers their bodies read, and the
        code their index checks store."""
        if not self.prologues:
            return self.make(self.name, self.ins, self.outs)
        return self.make(self.name, self.ins, self.outs,
                         (dict(self.prologues), buffers, error_code))


def plan_splits(max_len: int) -> tuple[int, int]:
    """(chunk, splits): chunks of CHUNK keys (longer for caches past MAX_SPLITS of them).

    A program's loop over its chunk is a chain of dependent loads, so a long chunk is slow
    however many programs run beside it; and only the chunks up to the position have work
    (each loop stops at the position), so short chunks keep the work spread at any length.
    (Chunks sized to give a fixed number of programs were 13 blocks long at batch 8 of GPT-2,
    all of the work of a short context in one chunk.)"""
    chunk = max(CHUNK, math.ceil(max_len / MAX_SPLITS / BLOCK_N) * BLOCK_N)
    return chunk, math.ceil(max_len / chunk)


_SPLIT = '''
@triton.jit
def {name}({lead}{k}, {v}, {pos}, {params}{mo}, {mm}, {ml}):
    bh = tl.program_id(0)
    s = tl.program_id(1)
    b = bh // {hkv}
    g = bh % {hkv}
    at = tl.load({pos}).to(tl.int32)
    n_valid = at + 1
    heads = tl.arange(0, {gp})
    hmask = heads < {group}
    rows = b * {heads} + g * {group} + heads
    dims = tl.arange(0, {dp})
    dmask = dims < {d}
    vdims = tl.arange(0, {dvp})
    vmask = vdims < {dv}
    qrows = b * {heads} + g * {group} + heads
    base = (b * {hkv} + g) * {m} * {d}
    vbase = (b * {hkv} + g) * {m} * {dv}
    span = tl.minimum(n_valid - s * {chunk}, {chunk})     # keys of this chunk up to pos
    end = s * {chunk} + span
{window_start}    keys = s * {chunk} + {start} + tl.arange(0, {block})
    kmask = (keys < end) & (keys < {m}){window_mask}
    kt = tl.load({k} + base + keys[:, None] * {d} + dims[None, :],
                 mask=kmask[:, None] & dmask[None, :], other=0.0)
    vt = tl.load({v} + vbase + keys[:, None] * {dv} + vdims[None, :],
                 mask=kmask[:, None] & vmask[None, :], other=0.0)
{wait}{q_load}    m_i = tl.full([{gp}], float("-inf"), tl.float32)
    l_i = tl.full([{gp}], 0.0, tl.float32)
    acc = tl.full([{gp}, {dvp}], 0.0, tl.float32)
{prelude}    for n0 in range({start}, span, {block}):
{key_new}{value_new}        qk = tl.dot(q, tl.trans(kt){precision}).to(tl.float32) * {scale}
{capped}        qk = tl.where(kmask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(qk, 1, aotc_maximum))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_ref)
        p = tl.exp(qk - m_ref[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, aotc_add)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt{precision}).to(tl.float32)
        m_i = m_new
        keys = keys + {block}     # the next block's keys and values (none past the chunk)
        kmask = (keys < end) & (keys < {m}){window_mask}
        kt = tl.load({k} + base + keys[:, None] * {d} + dims[None, :],
                     mask=kmask[:, None] & dmask[None, :], other=0.0)
        vt = tl.load({v} + vbase + keys[:, None] * {dv} + vdims[None, :],
                     mask=kmask[:, None] & vmask[None, :], other=0.0)
    part = rows * {splits} + s
    live = hmask & (heads * 0 + s * {chunk} <= at)   # the combine reads chunks up to pos only
    tl.store({mo} + part[:, None] * {dv} + vdims[None, :], acc,
             mask=live[:, None] & vmask[None, :])
    tl.store({mm} + part, m_i, mask=live)
    tl.store({ml} + part, l_i, mask=live)
'''

_COMBINE = '''
@triton.jit
def {name}({mo}, {mm}, {ml}, {pos}, {sink_param}{o}):
    row = tl.program_id(0)
    parts = tl.arange(0, {sp})
    at = tl.load({pos}).to(tl.int32)
    pmask = (parts < {splits}) & (parts * {chunk} <= at)   # chunks past pos: nothing stored
    dims = tl.arange(0, {dvp})
    dmask = dims < {dv}
{wait}    m = tl.load({mm} + row * {splits} + parts, mask=pmask, other=float("-inf"))
    l = tl.load({ml} + row * {splits} + parts, mask=pmask, other=0.0)
    top = tl.reduce(m, 0, aotc_maximum)
{sink_top}    w = tl.exp(m - top)
    acc = tl.load({mo} + (row * {splits} + parts[:, None]) * {dv} + dims[None, :],
                  mask=pmask[:, None] & dmask[None, :], other=0.0)
    out = tl.reduce(acc * w[:, None], 0, aotc_add) / (tl.reduce(w * l, 0, aotc_add){sink_den})
    tl.store({o} + row * {dv} + dims, out.to({o}.dtype.element_ty), mask=dmask)
'''


# `decode_attention_write`: the new key and value of this step (kn, vn [B, Hkv, 1, D]) are
# written into the caches at the position by the program whose chunk holds it, and used in
# place of the cache's row there (the program reads what it has in registers, never what it
# or another program just stored)
_Q_LOAD = """    q = tl.load({q} + qrows[:, None] * {d} + dims[None, :], mask=hmask[:, None] & dmask[None, :],
                other=0.0)
"""
# q computed by the kernel's prologue (codegen/triton/prologue.py) from what it is made of
_Q_PROLOGUE = """    q = tl.where(hmask[:, None] & dmask[None, :], q_value, 0.0)
"""
_K_LOAD = "tl.load({kn} + (b * {hkv} + g) * {d} + dims, mask=dmask, other=0.0)"
_K_PROLOGUE = "tl.reshape(key_value, [{dp}])"
_WRITE_PRELUDE = '''    k_new = {k_new}
    v_new = tl.load({vn} + (b * {hkv} + g) * {dv} + vdims, mask=vmask, other=0.0)
    mine = (at // {chunk} == s) & (at < {m})   # block masks below: the interpreter refuses
    # a scalar one; a position past the cache (a damaged manifest) writes nothing
    tl.store({k} + base + at * {d} + dims, k_new, mask=dmask & ((dims * 0 + mine) != 0))
    tl.store({v} + vbase + at * {dv} + vdims, v_new, mask=vmask & ((vdims * 0 + mine) != 0))
'''
# A sliding window: keys lo..pos alone (lo = pos + 1 - window); each loop starts at the first
# block holding one, so the chunks wholly before it cost a program that stores an empty partial.
_WINDOW_START = """    lo = n_valid - {window}
    first = tl.maximum(lo - s * {chunk}, 0) // {block} * {block}
"""
# Attention sinks: the head's learned logit joins the softmax (its weight goes to no value).
_SINK_TOP = """    sink = tl.load({sinks} + row % {heads}).to(tl.float32)
    top = tl.maximum(top, sink)
"""
# Where `early` (see decode_attention_kernels), the wait for the kernel before: what comes
# before it (the position, the chunk's first keys and values) overlaps that kernel's tail.
_WAIT = "    if AOTC_PDL:\n        tl.extra.cuda.gdc_wait()\n"
_SOFTCAP = "        qk = libdevice.tanh(qk / {softcap}) * {softcap}\n"
_WRITE_KEY = "        kt = tl.where((keys == at)[:, None], k_new[None, :], kt)\n"
_WRITE_VALUE = "        vt = tl.where((keys == at)[:, None], v_new[None, :], vt)\n"


def hand_source(name: str, text: str, ins, outs, grid, num_warps: int = 4,
                num_stages: int | None = None, waits_itself: bool = False,
                error_code: int | None = None):
    """The KernelSource of a hand-written kernel over whole Buffers `ins` and `outs` (pointer
    parameters in that order, no size parameters or constexprs: every size is in its text);
    `waits_itself`: the text places the PDL wait (build.with_pdl); with an `error_code`, the
    kernel takes `aotc_err` last and stores that code into it for an index out of range."""
    from aotc.codegen.triton.build import KernelSource, with_pdl
    from aotc.codegen.triton.printer import POINTER
    signature = {b.name: POINTER[b.dtype] for b in (*ins, *outs)}
    if error_code is not None:
        signature["aotc_err"] = "*i32"
    return KernelSource(name=name, text=with_pdl(text.lstrip("\n"), name, waits_itself),
                        ins=[b.name for b in ins],
                        outs=[b.name for b in outs], sizes=[], signature=signature,
                        constexprs={}, grid=[str(g) for g in grid], num_warps=num_warps,
                        error_code=error_code, num_stages=num_stages)


def _split_source(name: str, ins, outs, computed=None, **sizes):
    """`computed`: (the Prologues by role, "q" and "key", the step's buffers, the kernel's
    error code) for a q and a new key the kernel computes instead of loading them."""
    prologues, buffers, error_code = computed or ({}, {}, None)
    names = [b.name for b in ins]
    q = None if "q" in prologues else names.pop(0)
    k, v, pos, *new = names
    mo, mm, ml = (b.name for b in outs)
    early = sizes.pop("early")
    lines, lead, uses_err = _prologue_lines(prologues, buffers, error_code, sizes)
    own = {b.name for b in ins}
    lead = tuple(buffers[n] for n in lead if n not in own)
    safe = {n for n in (b.name for b in lead) if buffers[n].constant} | {pos}
    before, after = hoist_early(lines, safe) if early else ([], lines)
    write = {"params": "", "prelude": "", "key_new": "", "value_new": ""}
    if new:                    # (with the key computed, `new` holds the value alone)
        kn, vn = (None, *new) if "key" in prologues else new
        k_new = (_K_PROLOGUE if "key" in prologues else _K_LOAD).format(kn=kn, **sizes)
        write = {"params": "".join(f"{n}, " for n in new), "key_new": _WRITE_KEY,
                 "value_new": _WRITE_VALUE,
                 "prelude": _WRITE_PRELUDE.format(k_new=k_new, vn=vn, k=k, v=v, **sizes)}
    q_load = "".join(f"    {ln}\n" for ln in after) + \
        (_Q_PROLOGUE if "q" in prologues else _Q_LOAD).format(q=q, **sizes)
    window, softcap = sizes["window"], sizes["softcap"]
    extra = {"window_start": _WINDOW_START.format(**sizes) if window else "",
             "start": "first" if window else "0",
             "window_mask": " & (keys >= lo)" if window else "",
             "capped": _SOFTCAP.format(softcap=repr(softcap)) if softcap else ""}
    wait = "".join(f"    {ln}\n" for ln in before) + _WAIT if early else ""
    text = _SPLIT.format(name=name, k=k, v=v, pos=pos, mo=mo, mm=mm, ml=ml, **write,
                         **extra, **sizes, wait=wait, q_load=q_load,
                         lead="".join(f"{n}, " for n in (*(b.name for b in lead), q) if n))
    if uses_err:
        text = text.replace(f"{ml}):", f"{ml}, aotc_err):", 1)
    grid = (sizes["batch"] * sizes["hkv"], sizes["splits"], 1)
    return hand_source(name, text, (*lead, *ins), outs, grid, waits_itself=early,
                       error_code=error_code if uses_err else None)


def _prologue_lines(prologues: dict, buffers: dict, error_code, sizes) -> tuple:
    """(statements computing `q_value` [gp, dp] for the program's query heads and `key_value`
    [1, dp] for its KV head, as far as `prologues` has them; the buffers they read; whether
    they store the error code)."""
    from aotc.codegen.triton.prologue import prologue_lines
    # the padding heads' rows are past the value's (its loads masked off), not the next group's
    rows = {"q": ("tl.where(hmask, qrows, {rows})[:, None]".format(
                rows=sizes["batch"] * sizes["heads"]), sizes["gp"]),
            "key": ("(tl.full([1, 1], 0, tl.int32) + (b * {hkv} + g))".format(**sizes), 1)}
    lines, reads, uses_err = [], [], False
    for role, prologue in prologues.items():
        at, xblock = rows[role]
        src = prologue_lines(prologue, buffers, error_code, target=f"{role}_value", rows=at,
                             xblock=xblock, rblock=sizes["dp"])
        lines += src.lines
        reads += src.params
        uses_err |= src.uses_err
    return lines, list(dict.fromkeys(reads)), uses_err


def _combine_source(name: str, ins, outs, **sizes):
    mo, mm, ml, pos, *sinks = (b.name for b in ins)
    (o,) = (b.name for b in outs)
    sink = {"sink_param": "", "sink_top": "", "sink_den": ""}
    if sinks:
        sink = {"sink_param": f"{sinks[0]}, ", "sink_den": " + tl.exp(sink - top)",
                "sink_top": _SINK_TOP.format(sinks=sinks[0], **sizes)}
    early = sizes.pop("early")
    text = _COMBINE.format(name=name, mo=mo, mm=mm, ml=ml, pos=pos, o=o, **sink, **sizes,
                           wait=_WAIT if early else "")
    return hand_source(name, text, ins, outs, (sizes["batch"] * sizes["heads"], 1, 1),
                       waits_itself=early)


def decode_attention_kernels(q, k, v, pos, partials, out, scale: float, new=(), *,
                             window: int = 0, softcap: float = 0.0,
                             sinks=None, early: bool = False) -> list[HandKernel]:
    """The split and combine kernels for Buffers q [B, H, 1, D], key cache [B, Hkv, M, D],
    value cache [B, Hkv, M, Dv] (Dv may differ from D, as multi-head latent attention's),
    pos, partial buffers (o [B*H*splits, Dv], m and l [B*H*splits], float32) and the output
    [B, H, 1, Dv]; head sizes that are not powers of two are padded to one in registers and
    masked. With `new` (key [B, Hkv, 1, D], value [B, Hkv, 1, Dv]), the split kernel first
    writes them at pos; `window` (> 0) attends only the last `window` positions, `softcap`
    (> 0) soft-caps the scores, and the combine kernel adds each head's `sinks` [H] logit to
    its softmax. q and the new key may be Prologues (codegen/triton/prologue.py) instead of
    Buffers: the split kernel computes them (a rotary embedding of the product's rows, say)
    from what they are made of, where it would have loaded them, and with `early` the part of
    that which reads no kernel's output (the position, its table rows, index arithmetic) runs
    before the wait (build.hoist_early).

    `early` (with `new` only; the caller proves it): no kernel of the step before these writes
    the caches or the position, so both kernels read the position, and the split kernel its
    chunk's first keys and values, before waiting for the kernel before them (programmatic
    dependent launch, codegen/triton/build.py): the row at the position, which this step
    writes, is taken from the registers, never from what was read. What the run before wrote
    must be complete by then: codegen/lowering/decode.py `fence_early_reads` keeps `early`
    only where an extern step (launched without PDL: the position's write-back) follows the
    last write of what they read early."""
    from aotc.codegen.triton.prologue import Prologue
    early = bool(early and new)
    batch, heads, _, d = (int(x) for x in q.shape)
    hkv, m, dv = int(k.shape[1]), int(k.shape[2]), int(v.shape[3])
    chunk, splits = plan_splits(m)
    group = heads // hkv
    sizes = dict(batch=batch, heads=heads, hkv=hkv, group=group,
                 gp=max(16, pow2(group)), d=d, dp=max(16, pow2(d)), dv=dv, dvp=max(16, pow2(dv)),
                 m=m, chunk=chunk, block=BLOCK_N, splits=splits, sp=pow2(splits),
                 scale=repr(float(scale)), precision=dot_precision(q.dtype),
                 window=int(window), softcap=float(softcap))
    mo, mm, ml = partials
    computed = tuple((role, t) for role, t in zip(("q", "key"), (q, *new[:1]))
                     if isinstance(t, Prologue))
    loaded = (*(() if isinstance(q, Prologue) else (q,)), k, v, pos,
              *(t for t in new if not isinstance(t, Prologue)))
    split = HandKernel(name="kernel_split", prefix=(), ins=loaded,
                       prologues=computed,
                       outs=(mo, mm, ml), mutates=(k, v) if new else (), early=early,
                       read_early=(k, v, pos),
                       make=lambda n, i, o, *pro: _split_source(n, i, o, *pro, **sizes,
                                                                early=split.early))
    sink = (sinks,) if sinks is not None else ()
    combine = HandKernel(name="kernel_combine", prefix=(), ins=(mo, mm, ml, pos, *sink),
                         outs=(out,), early=early, read_early=(pos,),
                         make=lambda n, i, o: _combine_source(n, i, o, **sizes,
                                                              early=combine.early))
    written = "; writes this step's key and value" if new else ""
    written += f"; a window of {window} keys" if window else ""
    written += f"; scores soft-capped at {softcap}" if softcap else ""
    written += "".join(f"; computes {role} itself" for role, _ in computed)
    for hk, what in ((split, f"flash-decoding: {splits} chunks of {chunk} keys{written}"),
                     (combine, f"combine {splits} chunks" + (" and the heads' sinks"
                                                             if sinks is not None else ""))):
        hk.reasons.append(f"decode attention ({what}, {group} query heads per KV head)")
    return [split, combine]


def dot_precision(dtype) -> str:
    """The `tl.dot` argument for operands of `dtype`: float32 ones are multiplied in IEEE
    float32 (Triton's default, tf32, would drop 13 of their bits; torch's default matmul
    precision keeps them); bf16 and fp16 ones take their own tensor cores, summing in
    float32."""
    import torch
    return ', input_precision="ieee"' if dtype == torch.float32 else ""


def pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def partial_shapes(q, k, v) -> list[tuple]:
    """The split kernel's partials: weighted sums of values [rows, Dv], maxima and sums
    [rows] (rows: one per sequence, query head and chunk)."""
    batch, heads = (int(x) for x in q.shape[:2])
    _, splits = plan_splits(int(k.shape[2]))
    rows = batch * heads * splits
    return [(rows, int(v.shape[3])), (rows,), (rows,)]

