"""Graph lowering: a Program's graph in, an ordered list of plan steps and kernel nodes out.

Each graph node is lowered by the registry (`codegen/lowering`) into loop IR, or, when no
lowering claims it, becomes an extern ATen step. Pointwise results stay lazy and are inlined into
their consumers (vertical fusion); they are realized into buffers only when an extern op, a
graph output or an expensive multi-use needs storage. Reductions are always realized. Views of
realized tensors are index remaps for kernels and are emitted as ATen view steps only when an
extern op needs the tensor itself.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import count

import sympy
import torch

from aotc.codegen.ir import (EXPENSIVE, Buffer, ComputedBuffer, NullHandler, Pointwise, Reduction,
                             ReductionType, contiguous_strides, dims, index_vars, size_texts, sym)
from aotc.codegen.attention import place_sdpa_output, simplify_attention_mask
from aotc.codegen.extern_layout import channels_last_conv, lay_out_extern
from aotc.codegen.layouts import relaid
from aotc.codegen.lowering import LOWERINGS
from aotc.codegen.plan import is_view, torch_op
from aotc.errors import ExportError
from aotc.artifact.dtypes import DTYPES, LAYOUTS, MEMORY_FORMATS, dtype_name
from aotc.artifact.builder import Output, PlanBuilder
from aotc.artifact.encoding import SlotKind, StepKind

aten = torch.ops.aten

# a graph input's slot kind, and the field naming it (anything else is a model input: "name")
_BOUND = {"weight": (SlotKind.WEIGHT, "weight"), "state": (SlotKind.STATE, "state")}
INLINE_LIMIT = 48        # body size (ops) past which a lazy value is realized
MULTI_USE_COST = 6       # a value used more than once is realized past this cost


class TensorValue:
    """A tensor during lowering: lazy (a body to inline) or realized (a Buffer), maybe a view."""
    __slots__ = ("shape", "dtype", "loader", "buffer", "body", "view_of", "vid", "users",
                 "origins", "channels_last")

    def __init__(self, shape, dtype, loader, *, buffer=None, body=None, view_of=None, vid=None,
                 origins=()):
        self.shape, self.dtype, self.loader = tuple(shape), dtype, loader
        self.buffer, self.body, self.view_of, self.vid = buffer, body, view_of, vid
        self.users, self.origins = 0, tuple(origins)
        # computed from channels-last data (a channels-last convolution's output): realized,
        # it iterates and is stored channels-last too, so its reads and writes stay contiguous
        self.channels_last = False


class CostCounter(NullHandler):
    """Ops handler that counts the work in a body (for inlining decisions)."""

    def __init__(self):
        self.ops = 0
        self.expensive = 0

    def load(self, name, index):
        self.ops += 1
        return 0

    def op(self, op, *args):
        self.ops += 1
        self.expensive += op in EXPENSIVE
        return 0

    def masked(self, mask, fn, other, dtype):
        self.ops += 1
        return fn()

    def indirect(self, value, size, wraps=True, op="aten::index.Tensor"):
        self.ops += 1
        return sympy.Integer(0)


def body_cost(shape, fn) -> CostCounter:
    c = CostCounter()
    fn(c, index_vars("x", len(shape)))
    return c


@dataclass
class LoweredGraph:
    plan: PlanBuilder                             # the plan's slots, and its steps' maker
    steps: list = field(default_factory=list)     # ComputedBuffer | CallStep, in order
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)   # Output per graph output
    lowered: dict = field(default_factory=dict)   # op -> count of nodes lowered to loop IR
    fallback: dict = field(default_factory=dict)  # op -> count of nodes left to ATen
    rewrites: dict = field(default_factory=dict)  # graph rewrite -> count (before lowering)

    @property
    def slots(self) -> tuple:
        """The plan's slots (typed, artifact/schema/plan.py's Slot), by slot id."""
        return self.plan.slots


class GraphLowering:
    def __init__(self, graph: dict, *, codegen: bool = True, channels_last: bool = False,
                 split_reductions: bool = False, sdpa_layout: bool = False,
                 entry: str = "forward"):
        """`channels_last`: 2d convolutions run with channels-last weights and give channels-last
        outputs, which kernels read through their strides (oneDNN's fast layout on the CPU).
        `split_reductions` (the Triton backend): a long reduction onto few outputs runs in two
        stages (`_split`), so that it fills a GPU."""
        self.graph, self.codegen, self.channels_last = graph, codegen, channels_last
        self.sdpa_layout, self.split_reductions = sdpa_layout, split_reductions
        self.graph_outputs = {o["slot"] for o in graph["outputs"] if "slot" in o}
        self.values = graph["values"]
        self.out = LoweredGraph(plan=PlanBuilder(entry))
        self.plan = self.out.plan
        for meta in self.values:    # graph value i is slot i
            self._slot_for(meta)
        self.env: dict[int, TensorValue | object] = {}
        self.names = count()
        self.users = self._count_users()
        self.arg_origins: tuple = ()
        self.mask_facts: dict = {}   # slot -> 'none' | 'causal' | None: an SDPA mask
        self.bodies: dict = {}       # buffer name -> (Buffer, loader) of realized pointwise
        self.statistics: dict = {}   # per-column copies of row statistics (row_statistics.py)

    # ------------------------------------------------------------------------------ driving
    def run(self) -> LoweredGraph:
        for inp in self.graph["inputs"]:
            self._bind_input(inp)
        nodes = self.graph["nodes"]
        for node in nodes:
            if not node.get("writeback"):
                self._lower_node(node)
        outs = []
        for o in self.graph["outputs"]:
            outs.append(Output(slot=self.materialize(self.env[o["slot"]])) if "slot" in o
                        else Output(const=o["const"]))
        self.out.outputs = outs
        for node in nodes:   # state write-backs (codegen/state.py): after every read of it
            if node.get("writeback"):
                self._lower_node(node)
        return self.out

    def _count_users(self) -> dict[int, int]:
        users: dict[int, int] = {}

        def visit(a):
            if isinstance(a, list):
                for x in a:
                    visit(x)
            elif isinstance(a, dict) and "slot" in a:
                users[a["slot"]] = users.get(a["slot"], 0) + 1
        for node in self.graph["nodes"]:
            visit(node["args"])
            visit(list(node["kwargs"].values()))
        for o in self.graph["outputs"]:
            visit(o)
        return users

    def _slot_for(self, meta) -> int:
        if not (meta and "shape" in meta):
            return self.plan.add_slot()
        return self.plan.add_slot(shape=meta["shape"], dtype=meta["dtype"],
                                  stride=meta["stride"],
                                  contiguous=_is_contiguous(meta["shape"], meta["stride"]))

    def new_slot(self, shape, dtype, stride=None) -> int:
        stride = stride or contiguous_strides(shape)
        return self.plan.add_slot(shape=size_texts(shape), dtype=dtype_name(dtype),
                                  stride=size_texts(stride),
                                  contiguous=_is_contiguous(shape, stride))

    def buffer(self, sid: int) -> Buffer:
        """Slot `sid` as the loop IR's Buffer (`buf<sid>`)."""
        s = self.plan.slot(sid)
        return Buffer(name=f"buf{sid}", slot=sid, shape=dims(s.shape), stride=dims(s.stride),
                      dtype=DTYPES[s.dtype])

    def _bind_input(self, inp: dict) -> None:
        sid = inp["value"]
        kind, key = _BOUND.get(inp["kind"], (SlotKind.INPUT, "name"))
        slot = self.plan.update(sid, kind=kind, **{key: inp["name"]})
        if kind is SlotKind.INPUT:
            self.out.inputs.append(sid)
        if slot.is_tensor:
            self.env[sid] = self.realized(sid)

    def realized(self, sid: int) -> TensorValue:
        buf = self.buffer(sid)
        tv = TensorValue(buf.shape, buf.dtype, buf.loader(), buffer=buf, vid=sid)
        tv.users = self.users.get(sid, 0)
        return tv

    # ----------------------------------------------------------------------------- one node
    def _lower_node(self, node: dict) -> None:
        op = torch_op(node["op"])
        fn = LOWERINGS.get(op) if self.codegen else None
        result = None
        self.current_op, self.current_node = op, node
        if fn is not None:
            args = [self.decode(a) for a in node["args"]]
            kwargs = {k: self.decode(v) for k, v in node["kwargs"].items()}
            if is_view(op) and sum(self.users.get(o, 0) for o in node["out"]) > 1 \
                    and self._realize_shared(args):   # read the realized values from here on
                args = [self.decode(a) for a in node["args"]]
            self.arg_origins = _lazy_origins(args + list(kwargs.values()))
            metas = [self.values[o] for o in node["out"]]
            try:
                result = fn(self, metas, *args, **kwargs)
            except (TypeError, ValueError):
                if not _symbolic(node):
                    raise
                result = None   # a lowering that needs concrete sizes: leave it to ATen
        if result is None:
            self._extern(node, op)
            return
        self.out.lowered[node["op"]] = self.out.lowered.get(node["op"], 0) + 1
        results = result if isinstance(result, (tuple, list)) else (result,)
        if self.channels_last:
            self._propagate_channels_last(args + list(kwargs.values()), results)
        for vid, tv in zip(node["out"], results):
            self.env[vid] = tv          # first: realizing rebinds env entries to the buffer
            if isinstance(tv, TensorValue):
                self._name(tv, vid)

    @staticmethod
    def _propagate_channels_last(args, results) -> None:
        """A lazy 4d result over the same batch and channels as a channels-last argument (a
        pointwise op, a pooling window) inherits its layout."""
        sources = [a for a in args if isinstance(a, TensorValue) and a.channels_last]
        for tv in results:
            if (isinstance(tv, TensorValue) and tv.body is not None and tv.buffer is None
                    and len(tv.shape) == 4
                    and any(tuple(a.shape[:2]) == tuple(tv.shape[:2]) for a in sources)):
                tv.channels_last = True

    def _name(self, tv: TensorValue, vid: int) -> None:
        if tv.vid is None:
            tv.vid = vid
        tv.users = max(tv.users, self.users.get(vid, 0))
        if tv.body is not None and tv.buffer is None:
            cost = body_cost(tv.shape, tv.loader)
            if cost.ops > INLINE_LIMIT or (tv.users > 1 and _costly_to_repeat(cost)):
                self.realize(tv)

    def _realize_shared(self, args) -> bool:
        """A view read more than once hides its base's users: an expensive lazy base (a GELU
        backward, say) is realized first, so the view's readers load it instead of each
        recomputing it. Whether anything was realized."""
        shared = [a for a in args if isinstance(a, TensorValue) and a.body is not None
                  and a.buffer is None and _costly_to_repeat(body_cost(a.shape, a.loader))]
        for a in shared:
            self.realize(a)
        return bool(shared)

    def used(self, i: int) -> bool:
        """Whether output `i` of the node being lowered is read by anything."""
        return self.users.get(self.current_node["out"][i], 0) > 0

    def decode(self, a):
        if isinstance(a, list):
            return [self.decode(x) for x in a]
        if not isinstance(a, dict):
            return a
        (tag, payload), = a.items()
        if tag == "slot":
            return self.env[payload]
        if tag == "sym":
            e = sym(payload)
            return int(e) if e.is_Integer else e
        if tag == "float":
            return float(payload)
        if tag == "dtype":
            return DTYPES[payload]
        if tag == "device":
            return torch.device(payload)
        if tag == "layout":
            return LAYOUTS[payload]
        return MEMORY_FORMATS[payload]

    # ------------------------------------------------------------------------- IR creation
    def pointwise(self, shape, dtype, fn, origin: str) -> TensorValue:
        shape = tuple(sym(d) for d in shape)
        origins = _merge(self.arg_origins, (origin,))
        body = Pointwise(ranges=shape, dtype=dtype, inner_fn=fn, origins=origins)
        return TensorValue(shape, dtype, fn, body=body, origins=origins)

    def view(self, base: TensorValue, shape, fn, recipe) -> TensorValue:
        """A view: index remap `fn` for kernels; `recipe` (op, args, kwargs) for externs."""
        source = getattr(self, "current_node", {}).get("source")   # for errors naming it
        return TensorValue(shape, base.dtype, fn, view_of=(base, (*recipe, source)),
                           origins=base.origins)

    def reduction(self, ranges, rranges, rtype: ReductionType, dtype, fn, origin: str,
                  outputs: int = 1, out_dtypes=None) -> list[TensorValue]:
        ranges = tuple(sym(d) for d in ranges)
        rranges = tuple(sym(d) for d in rranges)
        origins = _merge(self.arg_origins, (origin,))
        if self.split_reductions and outputs == 1 and out_dtypes is None:
            split = self._split(ranges, rranges, rtype, dtype, fn, origins)
            if split is not None:
                rranges, fn = split
        body = Reduction(ranges=ranges, reduction_ranges=rranges,
                         reduction_type=rtype, dtype=dtype, inner_fn=fn, origins=origins)
        bufs = tuple(self.buffer(self.new_slot(ranges, d))
                     for d in (out_dtypes or [dtype] * outputs))
        self.out.steps.append(ComputedBuffer(buffers=bufs, body=body))
        return [TensorValue(ranges, b.dtype, b.loader(), buffer=b, origins=(origin,)) for b in bufs]

    def _split(self, ranges, rranges, rtype, dtype, fn, origins):
        """A split reduction (Inductor's): where `split_reduction` (codegen/triton/blocks.py)
        says a reduction onto few outputs is long enough, a first Reduction over rows (chunk,
        *ranges) reduces one chunk of each output's elements into a partial buffer in the
        accumulation dtype, and the reduction itself becomes one over the chunks (the new
        (reduction ranges, body) are returned; None: unchanged). Chunks are whole index ranges
        (c consecutive indices of one reduced dim, all of the dims after it), so no lane is
        masked and every index stays affine. Deterministic: no atomics; the sum's order of
        additions differs from one stage's (floats may round differently)."""
        from aotc.codegen.scheduler import LoadRecorder
        from aotc.codegen.triton.blocks import SPLITTABLE, reduction_order, split_reduction
        if rtype not in SPLITTABLE:
            return None
        rec = LoadRecorder()
        pvars, rvars = index_vars("p", len(ranges)), index_vars("r", len(rranges))
        fn(rec, pvars, rvars)
        order = reduction_order(rec.loads, dict(zip(pvars, ranges)), dict(zip(rvars, rranges)))
        split = split_reduction(ranges, rranges, order == "outer")
        if split is None:
            return None
        chunks, j, c = split
        lead, d, tail = rranges[:j], int(rranges[j]), rranges[j + 1:]
        n = len(lead)
        part_rows = (*lead, sym(d // c), *ranges)          # (chunk, *ranges), chunk unravelled
        part_rranges = ((sym(c),) if c > 1 else ()) + tail

        def part_fn(h, idx, ridx):
            k, rest = idx[n], ridx
            if c > 1:
                k, rest = k * c + ridx[0], ridx[1:]
            return fn(h, idx[n + 1:], (*idx[:n], k, *rest))
        part = self.buffer(self.new_slot(part_rows, dtype))
        self.out.steps.append(ComputedBuffer(buffers=(part,), body=Reduction(
            ranges=part_rows, reduction_ranges=part_rranges, reduction_type=rtype, dtype=dtype,
            inner_fn=part_fn, origins=_merge(origins, (f"split{chunks}",)))))
        load = part.loader()
        return (*lead, sym(d // c)), lambda h, idx, ridx: load(h, (*ridx, *idx))

    def realize(self, tv: TensorValue) -> Buffer:
        if tv.buffer is not None:
            return tv.buffer
        if tv.channels_last:
            return self._realize_channels_last(tv)
        sid = self.new_slot(tv.shape, tv.dtype)
        if tv.vid is not None and self.plan.slot(tv.vid).is_tensor \
                and self.plan.slot(tv.vid).producer is None:
            sid = self._claim(sid, tv.vid, tv.shape, tv.dtype)
        buf = self.buffer(sid)
        body = Pointwise(ranges=tv.shape, dtype=tv.dtype, inner_fn=tv.loader, origins=tv.origins)
        self.out.steps.append(ComputedBuffer(buffers=(buf,), body=body))
        self.bodies[buf.name] = (buf, tv.loader)   # for proofs about values read from it
        return self._bind_realized(tv, buf)

    def _realize_channels_last(self, tv: TensorValue) -> Buffer:
        """`tv` (n, c, h, w) stored channels-last: the kernel loops over (n, h, w, c), so its
        innermost loop runs along the contiguous channels of its output and of its inputs."""
        n, c, h, w = tv.shape
        sid = self.new_slot(tv.shape, tv.dtype, stride=(h * w * c, sym(1), w * c, c))
        buf = self.buffer(sid)
        nhwc = Buffer(name=buf.name, slot=sid, shape=(n, h, w, c),
                      stride=contiguous_strides((n, h, w, c)), dtype=tv.dtype)
        load = tv.loader
        body = Pointwise(ranges=nhwc.shape, dtype=tv.dtype, origins=tv.origins,
                         inner_fn=lambda hd, i: load(hd, (i[0], i[3], i[1], i[2])))
        self.out.steps.append(ComputedBuffer(buffers=(nhwc,), body=body))
        return self._bind_realized(tv, buf)

    def _bind_realized(self, tv: TensorValue, buf: Buffer) -> Buffer:
        # `tv` keeps its lazy loader: bodies built before this point may read it at any time
        # (they recompute the value inline). Later consumers get a value that loads the buffer.
        tv.buffer = buf
        loaded = TensorValue(tv.shape, tv.dtype, buf.loader(), buffer=buf, vid=tv.vid,
                             origins=tv.origins)
        loaded.users, loaded.channels_last = tv.users, tv.channels_last
        for key, value in list(self.env.items()):
            if value is tv:
                self.env[key] = loaded
        return buf

    def _claim(self, spare: int, vid, shape, dtype) -> int:
        """Reuse graph value `vid`'s slot for a contiguous kernel output (drop the spare)."""
        self.plan.drop_last(spare)
        self.plan.update(vid, shape=size_texts(shape), dtype=dtype_name(dtype),
                         stride=size_texts(contiguous_strides(shape)), producer=StepKind.KERNEL,
                         contiguous=True)
        return vid

    # ----------------------------------------------------------------------------- externs
    def extern_call(self, op: str, tensors: list, shape, dtype) -> TensorValue:
        """An ATen call that a lowering makes itself (an `mm` whose bias add it keeps lazy):
        one extern step into a new contiguous slot, returned as a realized value."""
        args = [{"slot": self.materialize(t)} for t in tensors]
        sid = self.new_slot(tuple(sym(d) for d in shape), dtype)
        self.plan.update(sid, producer=StepKind.EXTERN)
        self.out.steps.append(self.plan.call(op, args, {}, [sid]))
        self.out.fallback[op] = self.out.fallback.get(op, 0) + 1
        return self.realized(sid)

    def materialize(self, tv) -> int:
        """The slot holding `tv` as a real tensor, emitting a view step or a kernel if needed."""
        if not isinstance(tv, TensorValue):
            raise TypeError(f"not a tensor: {tv!r}")
        if tv.buffer is not None:
            return tv.buffer.slot
        if tv.view_of is not None:
            base, (op, args, kwargs, source) = tv.view_of
            base_slot = self.materialize(base)
            sid = tv.vid if tv.vid is not None and self.plan.slot(tv.vid).producer is None \
                else None
            if sid is None or not self.plan.slot(sid).is_tensor or \
                    relaid(self.values, self.plan, base):
                return self.realize(tv).slot
            self.plan.update(sid, producer=StepKind.VIEW)
            op, args, kwargs = lay_out_extern(   # a channels-last base, say
                self, True, op, [{"slot": base_slot}, *args], kwargs, [sid])
            self.out.steps.append(self.plan.call(op, args, kwargs, [sid], view=True,
                                                 source=source or None))
            tv.buffer = self.buffer(sid)
            return sid
        return self.realize(tv).slot

    def _extern(self, node: dict, op) -> None:
        self.out.fallback[node["op"]] = self.out.fallback.get(node["op"], 0) + 1
        if op == aten.scaled_dot_product_attention.default:
            node = simplify_attention_mask(self, node)
            if self.sdpa_layout:
                place_sdpa_output(self, node)
        args = [self._rewrite(a) for a in node["args"]]
        kwargs = {k: self._rewrite(v) for k, v in node["kwargs"].items()}
        view = is_view(op)
        for vid in node["out"]:
            self.plan.update(vid, producer=StepKind.VIEW if view else StepKind.EXTERN)
        layout_cl = (op == aten.convolution.default and self.channels_last
                     and channels_last_conv(self, node, args))
        name = node["op"]   # convolutions' and SDPA's layouts are planned where they are made
        if op not in (aten.convolution.default, aten.scaled_dot_product_attention.default):
            name, args, kwargs = lay_out_extern(self, view, name, args, kwargs, node["out"])
        self.out.steps.append(self.plan.call(
            name, args, kwargs, node["out"], view=view, single=node["single"],
            source=node.get("source") or None,   # the model's line, for errors naming a step
            binds=node.get("binds")))            # value-dependent sizes its result defines
        for vid in node["out"]:
            meta = self.values[vid]
            if meta and "shape" in meta:
                self.env[vid] = self.realized(vid)
                self.env[vid].channels_last = layout_cl
            else:
                self.env[vid] = None

    def _rewrite(self, a):
        if isinstance(a, list):
            return [self._rewrite(x) for x in a]
        if isinstance(a, dict) and "slot" in a:
            return {"slot": self.materialize(self.env[a["slot"]])}
        if isinstance(a, dict) and "sym" in a and not sym(a["sym"]).is_integer:
            raise ExportError("an ATen call that aotc does not compile takes a float computed "
                              "from dynamic sizes", where=str(self.current_node.get("source")
                              or self.current_node["op"]), expected="integer sizes in plan "
                              "steps", found=a["sym"], fix="export the dim static, or compute "
                              "the value in integers")
        return a


def _costly_to_repeat(cost) -> bool:
    """Whether each reader recomputing a value costs more than storing it once."""
    return cost.expensive or cost.ops > MULTI_USE_COST


def _is_contiguous(shape, stride) -> bool:
    """Row-major contiguity, ignoring the strides of size-1 dims (as torch does)."""
    want = contiguous_strides([sym(d) for d in shape])
    return all(sym(d) == 1 or sympy.simplify(sym(s) - w) == 0
               for d, s, w in zip(shape, stride, want))


def _symbolic(node: dict) -> bool:
    return '"sym"' in json.dumps([node["args"], node["kwargs"]])


def _lazy_origins(args) -> tuple:
    """Origins of the lazy values among `args`: the ops a new body will inline."""
    out: tuple = ()
    for a in args:
        if isinstance(a, list):
            out = _merge(out, _lazy_origins(a))
        elif isinstance(a, TensorValue) and a.buffer is None:
            out = _merge(out, a.origins)
    return out


def _merge(a: tuple, b: tuple) -> tuple:
    return tuple(dict.fromkeys(a + b))
