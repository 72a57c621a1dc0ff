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

import contextlib
import re
from pathlib import Path

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from aotc.errors import AotcError
from aotc.exporter import complex as complex_

aten = torch.ops.aten

# Ops kept whole: vendor kernels (matmul family, convolution, attention) and fused norms that the
# codegen lowers as one reduction kernel rather than as a chain of small ops. (linear and matmul
# are composites: their table entries turn them, symbolically, into the matmul family.)
KEEP = frozenset({
    aten.addmm.default, aten.mm.default,
    aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default,
    aten.native_layer_norm.default,
    aten._native_batch_norm_legit_no_training.default,
    # a scatter-add over the vocabulary: ATen's kernel sorts the indices once and sums each
    # row's gradients in one pass; decomposed, it is index_put(accumulate=True) into a float32
    # copy of the whole table and a cast back (over 4x its time for BERT on an H200)
    aten.embedding_dense_backward.default,
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
# The bounds-checked forms of ops that skip index checks (upsampling decomposes into
# _unsafe_index): plans never call an unchecked op (artifact/schema/extern_ops.txt has none).
CHECKED = {aten._unsafe_index.Tensor: aten.index.Tensor,
           aten._unsafe_index_put.default: aten.index_put.default}
_REPLACE = {aten.view.default: aten.reshape.default,
            aten._unsafe_view.default: aten.reshape.default, **CHECKED, **MIRRORS}


def decomposition_table() -> dict:
    table = {op: fn for op, fn in core_aten_decompositions().items() if op not in KEEP}
    table.update({op: checked for op, checked in CHECKED.items()})
    table[aten.pad.default] = _pad   # inside other decompositions too (im2col's F.pad)
    return table


def _prod(xs):
    out = 1
    for x in xs:
        out = out * x
    return out


def _linear(x, weight, bias=None):
    """linear as addmm/mm on x folded to 2-D: size-generic (torch's composite reads ints)."""
    n, k = weight.shape
    x2 = aten.reshape.default(x, [_prod(x.shape[:-1]), k]) if x.dim() != 2 else x
    wt = aten.permute.default(weight, [1, 0])
    y = aten.addmm.default(bias, x2, wt) if bias is not None else aten.mm.default(x2, wt)
    return aten.reshape.default(y, [*x.shape[:-1], n]) if x.dim() != 2 else y


def _matmul(a, b):
    """matmul for the shapes models use (N-d @ 2-d, batched @ batched of equal batch dims) as
    mm/bmm on folded views; other forms keep torch's composite."""
    if a.dim() >= 2 and b.dim() == 2:
        if a.dim() == 2:
            return aten.mm.default(a, b)
        a2 = aten.reshape.default(a, [_prod(a.shape[:-1]), a.shape[-1]])
        return aten.reshape.default(aten.mm.default(a2, b), [*a.shape[:-1], b.shape[-1]])
    if a.dim() == b.dim() >= 3 and list(a.shape[:-2]) == list(b.shape[:-2]):
        batch = _prod(a.shape[:-2])
        a3 = aten.reshape.default(a, [batch, a.shape[-2], a.shape[-1]])
        b3 = aten.reshape.default(b, [batch, b.shape[-2], b.shape[-1]])
        return aten.reshape.default(aten.bmm.default(a3, b3),
                                    [*a.shape[:-2], a.shape[-2], b.shape[-1]])
    return aten.matmul.default(a, b)


def _pad(x, pad, mode="constant", value=None):
    """F.pad as the op its mode names: ATen's composite reads the sizes as ints, which fixed a
    dynamic batch dim (ConvBERT's unfold, SEW's positional convolution)."""
    if mode == "constant":
        return _constant_pad(x, pad, 0.0 if value is None else value)
    ops = {"reflect": "reflection_pad", "replicate": "replication_pad"}
    if mode in ops and len(pad) in (2, 4, 6):
        return getattr(aten, f"{ops[mode]}{len(pad) // 2}d").default(x, pad)
    return aten.pad.default(x, pad, mode, value)


def _constant_pad(x, pad, value):
    """constant_pad_nd; on symbolic sizes or pads, as crops and concatenations with filled
    blocks (its kernel, run on fake tensors, reads every size and pad as an int); a pad's
    sign decides how much is cropped and how much filled (`_signed`), so no branch is taken
    on a sign that is not known."""
    if all(type(d) is int for d in (*x.shape, *pad)):
        return aten.constant_pad_nd.default(x, pad, value)
    for i in range(len(pad) // 2):
        d, lo, hi = x.dim() - 1 - i, pad[2 * i], pad[2 * i + 1]
        (crop_lo, fill_lo), (crop_hi, fill_hi) = _signed(lo), _signed(hi)
        if not _zero(crop_lo, crop_hi):
            x = aten.slice.Tensor(x, d, crop_lo, x.shape[d] - crop_hi)
        blocks = [None if _zero(n) else aten.full.default(
            [*x.shape[:d], n, *x.shape[d + 1:]], value, dtype=x.dtype, device=x.device)
            for n in (fill_lo, fill_hi)]
        parts = [p for p in (blocks[0], x, blocks[1]) if p is not None]
        x = aten.cat.default(parts, d) if len(parts) > 1 else x
    return x


def _signed(p):
    """A pad as (elements cropped, elements filled): by its sign where that is known (an int,
    or a symbol's proved range), else both as `sym_max` expressions."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    if statically_known_true(p >= 0):
        return 0, p
    if statically_known_true(p <= 0):
        return -p, 0
    return torch.sym_max(-p, 0), torch.sym_max(p, 0)


def _zero(*sizes) -> bool:
    return all(type(n) is int and n == 0 for n in sizes)


def _baddbmm(x, batch1, batch2, *, beta=1, alpha=1):
    """baddbmm with its input broadcast to the product's shape first (BLOOM's alibi,
    [batch*heads, 1, kv]): torch's meta function expands it with sizes read as ints, which
    fails on a dynamic dim."""
    shape = [batch1.shape[0], batch1.shape[1], batch2.shape[2]]
    if x.dim() != 3 or any(type(a) is int and a == 1 and not (type(b) is int and b == 1)
                           for a, b in zip(x.shape, shape)):
        x = aten.expand.default(x, shape)
    return aten.baddbmm.default(x, batch1, batch2, beta=beta, alpha=alpha)


def _grouped_mm(x, w, offs=None, bias=None, out_dtype=None):
    """A mixture of experts' grouped product, x [S, K] (rows sorted by expert) times w [E, K, N]
    with offs [E] the cumulative row counts: row s takes expert e(s) = #(offs <= s). Written as
    a reduction over K of x[s] * w[e(s)], which codegen fuses into one kernel that reads only
    the selected experts' weights (static shapes, no data-dependent split into groups); rows
    past offs[-1] (transformers' expert-parallel sentinels) take the last expert."""
    if offs is None or x.dim() != 2 or w.dim() != 3 or bias is not None:
        return aten._grouped_mm.default(x, w, offs, bias, out_dtype)
    rows = torch.arange(x.shape[0], device=x.device)
    expert = (offs[None, :] <= rows[:, None]).sum(-1).clamp(max=w.shape[0] - 1)
    acc = torch.float64 if w.dtype == torch.float64 else torch.float32
    y = (x.to(acc)[:, :, None] * w[expert].to(acc)).sum(1)
    return y.to(out_dtype or x.dtype)


# aotc's own decompositions of composite ops, applied while replaying the exported graph
# (by the op, or by its qualified name for ops of libraries aotc does not import: transformers'
# grouped product, (input, weight, offs), for what torch's kernel does not take: fp32, CPUs).
OWN = {aten.linear.default: _linear, aten.matmul.default: _matmul,
       aten._grouped_mm.default: _grouped_mm, aten.pad.default: _pad,
       aten.baddbmm.default: _baddbmm}
OWN_BY_NAME = {"transformers.grouped_mm_fallback.default": _grouped_mm}


def _upsampling() -> dict:
    """Upsampling by output size or scale (`F.interpolate`): their `.vec` composites read an
    output size as plain ints, which fails on a dynamic dim; torch's Python decompositions
    keep it symbolic."""
    from torch._decomp import decomposition_table as torch_decompositions
    names = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
             "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
             "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
             "upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")
    ops = [getattr(getattr(aten, n), "vec", None) for n in names if hasattr(aten, n)]
    return {op: torch_decompositions[op] for op in ops if op in torch_decompositions}


OWN.update(_upsampling())


class _Replay(torch.fx.Interpreter):
    """Replays an exported graph: views become reshapes, kept composites become mirrors,
    linear, matmul and upsampling run Python decompositions (their C++ composites read sizes
    as plain ints, which would freeze dynamic dims), and complex values are carried as real
    pairs (exporter/complex.py)."""

    def __init__(self, gm):
        super().__init__(gm)
        self.extra_traceback = False   # aotc's errors say where themselves (_located)

    def run_node(self, n):
        try:
            out = super().run_node(n)
        except AotcError as e:
            raise _located(e, n) from None
        val = n.meta.get("val")
        if n.op == "placeholder" and isinstance(val, torch.Tensor) and val.is_complex():
            return complex_.Pairs(out if not out.is_complex() else torch.view_as_real(out))
        if n.op == "output":
            for v in torch.utils._pytree.tree_leaves(out):
                complex_.refuse(v, "output", n.name)
        return out

    def call_function(self, target, args, kwargs):
        if complex_.involved(target, args, kwargs):
            return complex_.call(target, args, kwargs)
        own = OWN.get(target) or OWN_BY_NAME.get(str(target))
        if own is not None:
            return own(*args, **kwargs)
        if target is getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None):
            # a `torch.no_grad()` block of forward: its graph replayed as this one is (run as
            # it is, its views and composites would freeze value-dependent sizes)
            enabled, block, *block_args = args
            with torch.set_grad_enabled(enabled):
                return _Replay(block).run(*block_args)
        if target is aten.size.default:     # keep sizes symbolic (the op's meta makes ints)
            return tuple(args[0].shape)
        if target is aten.sym_size.int:
            return args[0].shape[args[1]]
        if target is aten.stride.default:
            return tuple(args[0].stride())
        return complex_.made(target, super().call_function(_REPLACE.get(target, target),
                                                           args, kwargs))


def _located(e: AotcError, node) -> AotcError:
    """`e` with the model's source line that made `node` added to where it happened (the last
    frame of the node's stack trace), as a fresh error of the same class."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', node.stack_trace or "")
    if not frames:
        return e
    file, line, code = frames[-1]
    where = f"{e.where + ' ' if e.where else ''}at {Path(file).name}:{line} ({code.strip()[:120]})"
    return type(e)(e.what, where=where, expected=e.expected, found=e.found, fix=e.fix)


def decompose(gm: torch.fx.GraphModule, flat_args: list, *,
              symbolic: bool = False) -> torch.fx.GraphModule:
    """Re-trace `gm` (called with `flat_args`) into aotc's core ATen op set, functionalized.
    With `symbolic`, user inputs are export's fake tensors with symbolic sizes: the re-trace
    runs in export's fake mode so the sizes stay symbols."""
    from aotc.exporter.selects import with_selects_pushed
    table = decomposition_table()
    gm = with_selects_pushed(gm)

    def replay(*args):
        return _Replay(gm).run(*args)

    functional = torch.func.functionalize(replay, remove="mutations")
    # each re-traced node keeps the stack trace of the exported node it came from, so plan
    # steps can name the model's source line
    # mkldnn off: torch decomposes an LSTM for inference on the CPU into mkldnn_rnn_layer
    # calls, a CPU-only op no runner calls, and into matmuls and pointwise steps otherwise
    with torch.fx.traceback.preserve_node_meta(), _mkldnn_off():
        return _retrace(functional, flat_args, table, symbolic)


@contextlib.contextmanager
def _mkldnn_off():
    """mkldnn off, nothing else changed (torch.backends.mkldnn.flags also resets oneDNN's
    TF32 and determinism settings, and warns on every call where there is no Intel GPU)."""
    before = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


def _retrace(functional, flat_args: list, table: dict, symbolic: bool) -> torch.fx.GraphModule:
    if symbolic:
        from torch._guards import detect_fake_mode
        fake_mode = detect_fake_mode(flat_args)
        fakes = [a if isinstance(a, torch._subclasses.FakeTensor)
                 else fake_mode.from_tensor(a, static_shapes=True) for a in flat_args]
        with fake_mode, torch.no_grad():
            traced = make_fx(functional, decomposition_table=table, tracing_mode="real")(*fakes)
    else:
        with torch.no_grad():
            traced = make_fx(functional, decomposition_table=table, tracing_mode="fake",
                             _allow_non_fake_inputs=True)(*flat_args)
    _out_of_place(traced.graph)
    traced.graph.eliminate_dead_code()
    traced.recompile()
    return traced


def _out_of_place(graph: torch.fx.Graph) -> None:
    """In-place ops left on temporaries, made functional. A C++ composite that decomposes
    below functionalization can leave one (torch's rms_norm without a weight: `mean(...)
    .add_(eps)`): `y = t.op_(...)` becomes `y = t.op(...)`, and every later use of `t` reads
    `y`. A temporary that is a view of another tensor is left as it is (writing it writes
    its base; plans refuse the op)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for n in list(graph.nodes):
        target = n.target
        if n.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        name = target.overloadpacket.__name__
        functional = _functional(target)
        if not name.endswith("_") or name.startswith("_") or functional is None \
                or not target._schema.arguments or not n.args:
            continue
        base = n.args[0]
        # an op that changes only the tensor's metadata (transpose_, squeeze_) writes no
        # memory, so it is functional on a view as well: later uses read its result
        meta_only = torch.Tag.inplace_view in target.tags
        if not isinstance(base, torch.fx.Node) or base.op != "call_function" or not meta_only \
                and (getattr(base.target, "is_view", False) or _views(base)):
            continue
        for use in list(base.users):
            if use is not n and order[use] > order[n]:
                use.replace_input_with(base, n)
        n.target = functional


def _functional(target):
    """The out-of-place overload of in-place op `target` (`add_.Tensor` -> `add.Tensor`), by
    name, else the one taking the same arguments (`transpose_.default` -> `transpose.int`)."""
    name = target.overloadpacket.__name__
    packet = getattr(aten, name[:-1], None) if name.endswith("_") else None
    if packet is None:
        return None
    same = getattr(packet, target._overloadname, None)
    if same is not None:
        return same
    args = [(a.name, str(a.type)) for a in target._schema.arguments]
    for overload in packet.overloads():
        op = getattr(packet, overload)
        if [(a.name, str(a.type)) for a in op._schema.arguments] == args:
            return op
    return None


def _views(node) -> bool:
    """Whether `node`'s op returns a view of an input (its schema aliases its result)."""
    schema = getattr(node.target, "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None)
