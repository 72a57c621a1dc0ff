"""Scheduling: realized loop-IR nodes in, kernels (fusion groups) out, each decision with a reason.

A kernel is an outer loop nest over a `prefix` of sizes shared by all its nodes; inside it, each
node runs its own inner loops (a pointwise node over the rest of its dims, a reduction over its
reduction dims). Nodes join the current kernel when

  * their iteration space starts with the kernel's prefix (a reduction: equals it), and
  * every value they read from a node already in the kernel lies in the same prefix row, so
    the loop order inside the row makes the fusion legal (softmax: max, sum, normalize; layer
    norm: statistics, then normalize; a pointwise epilogue after a reduction).

Fused nodes never recompute work: bodies were inlined during lowering, and a realized node is
computed once. Reduction results read only inside their kernel stay in registers (no buffer).
Nodes with the same prefix and no dependence fuse horizontally (one loop nest, one launch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from aotc.codegen.ir import (Buffer, ComputedBuffer, NullHandler, Pointwise, Reduction,
                             contiguous_strides, index_bounds, index_vars, linear_index, product)
from aotc.artifact.schema.plan import CallStep
from aotc.artifact.schema.types import StepKind
from aotc.artifact.schema.launch import BLOCK_NODES, MAX_BLOCKS


@dataclass
class Kernel:
    name: str
    prefix: tuple
    nodes: list = field(default_factory=list)      # ComputedBuffers, in order
    reasons: list = field(default_factory=list)    # one line per decision
    local: set = field(default_factory=set)        # buffer names kept in registers

    @property
    def writes(self) -> list:
        return [b for n in self.nodes for b in n.buffers]

    @property
    def reads(self) -> set[str]:
        """Names of the buffers its nodes load (its own buffers included)."""
        return {name for n in self.nodes for name, _ in node_loads(n, len(self.prefix))[0]}


class LoadRecorder(NullHandler):
    """Ops handler that records (buffer, index) of every load in a body."""

    def __init__(self):
        self.loads: list[tuple[str, sympy.Expr]] = []

    def load(self, name, index):
        self.loads.append((name, sympy.expand(index)))
        return 0

    def indirect(self, value, size, wraps=True, op="aten::index.Tensor"):
        return sympy.Symbol(f"indirect{len(self.loads)}", integer=True, nonnegative=True)


def node_prefix(node: ComputedBuffer) -> tuple:
    body = node.body
    if isinstance(body, Reduction):
        return tuple(body.ranges)
    r = tuple(body.ranges)
    return r[:-1] if len(r) >= 2 else r


def node_loads(node: ComputedBuffer, prefix_len: int) -> tuple[list, tuple, dict]:
    """Loads of a node's body with row vars p0.. for the first `prefix_len` dims, and the
    ranges of its inner loop vars."""
    body = node.body
    rec = LoadRecorder()
    pvars = index_vars("p", prefix_len)
    if isinstance(body, Reduction):
        inner, sizes = index_vars("r", len(body.reduction_ranges)), body.reduction_ranges
        body.inner_fn(rec, pvars, inner)
    else:
        inner = index_vars("x", len(body.ranges) - prefix_len)
        sizes = body.ranges[prefix_len:]
        body.inner_fn(rec, pvars + inner)
    return rec.loads, pvars, dict(zip(inner, sizes))


def _row_local(index, buf, prefix, pvars, inner_ranges) -> bool:
    """Whether `index` into `buf` (written earlier in the same kernel) stays in the current row:
    the row's base, plus an offset over the reader's inner vars that stays inside the row. A
    row var of a size-1 dim is 0 (a view may leave it out of the index, or give it a stride)."""
    k = len(prefix)
    rest = sympy.expand(index - linear_index(pvars, buf.stride[:k]))
    rest = rest.subs({v: 0 for v, n in zip(pvars, prefix) if n == 1})   # size-1 dims: index 0
    if rest.free_symbols - set(inner_ranges):
        return False
    bounds = index_bounds(rest, inner_ranges)
    return bounds is not None and bounds[0] >= 0 and bounds[1] < product(buf.shape[k:])


def can_fuse(kernel: Kernel, node: ComputedBuffer, views: dict | None = None
             ) -> tuple[bool, str]:
    """Whether `node` may join `kernel`, and why; `views`: buffer name -> the buffer a view
    step made it a view of (what the kernel writes may be read through one)."""
    prefix = kernel.prefix
    body = node.body
    ranges = tuple(body.ranges)
    what = f"{node.buffers[0].name} ({'+'.join(body.origins)})"
    if isinstance(body, Reduction) and ranges != prefix:
        return False, f"{what}: reduction rows {list(ranges)} != kernel rows {list(prefix)}"
    if ranges[:len(prefix)] != prefix or (not prefix and ranges):
        return False, f"{what}: iteration space {list(ranges)} does not start with {list(prefix)}"
    if (full := _over_block_limits(kernel, node, prefix)):
        return False, f"{what}: {full}"
    loads, pvars, inner_ranges = node_loads(node, len(prefix))
    written = {b.name: b for b in kernel.writes}
    if any((views or {}).get(name) in written for name, _ in loads):
        return False, f"{what}: reads a view of a buffer this kernel writes"
    dependent = False
    for name, index in loads:
        if name in written:
            dependent = True
            if not _row_local(index, written[name], prefix, pvars, inner_ranges):
                return False, f"{what}: reads {name} outside the current row"
    how = "vertical (reads values of this row)" if dependent else "horizontal (independent)"
    return True, f"{what}: {how}, rows {list(prefix)}"


def _blocked(node: ComputedBuffer, prefix: tuple) -> bool:
    """Whether `node` loops over elements of its own in a kernel of rows `prefix` (a reduction,
    or inner dims): a Triton kernel gives it a block size of its own (R<n>_BLOCK)."""
    return isinstance(node.body, Reduction) or len(node.body.ranges) > len(prefix)


def _over_block_limits(kernel: Kernel, node: ComputedBuffer, prefix: tuple) -> str | None:
    """Why `node` would take `kernel` past the block sizes a launch spec holds (the schema's
    limits, artifact/schema/launch.py), or None: a backward's many bias and norm gradients are
    independent reductions over the same rows and would otherwise all join one kernel."""
    if not _blocked(node, prefix):
        return None
    if len(kernel.nodes) >= BLOCK_NODES:
        return f"the kernel has {len(kernel.nodes)} nodes, a block is named by its node's " \
               f"index (at most {BLOCK_NODES - 1})"
    blocks = 1 + sum(_blocked(n, prefix) for n in kernel.nodes)     # XBLOCK and the R blocks
    if blocks >= MAX_BLOCKS:
        return f"the kernel has {blocks} block sizes, the most a launch spec holds"
    return None


def reshaped(node: ComputedBuffer, prefix: tuple) -> ComputedBuffer | None:
    """`node`, a pointwise node of contiguous buffers, iterated over `prefix` and then its
    remaining dims, where that differs from its own iteration space only by dims of size 1
    (a decode step's [1, K] row against a kernel's rows [1, 1], or [1, 1, N] against [1, N]),
    else None. Dims of size 1 do not move an element of a contiguous buffer, so the same
    stores land where they did: the node's buffers are rebound to the new shape (the same
    names and slots), its body reads its own indices with 0 for each dim of size 1."""
    body = node.body
    if isinstance(body, Reduction) or not prefix:
        return None
    ranges = tuple(body.ranges)
    big = [d for d in ranges if d != 1]
    lead = [d for d in prefix if d != 1]
    if big[:len(lead)] != lead or tuple(ranges[:len(prefix)]) == tuple(prefix):
        return None
    shape = (*prefix, *big[len(lead):])
    if any(tuple(b.shape) != ranges or tuple(b.stride) != contiguous_strides(b.shape)
           for b in node.buffers):
        return None
    own = [i for i, d in enumerate(ranges) if d != 1]
    new = [i for i, d in enumerate(shape) if d != 1]
    fn = body.inner_fn

    def inner_fn(h, idx):
        full = [sympy.Integer(0)] * len(ranges)
        for i, j in zip(own, new):
            full[i] = idx[j]
        return fn(h, tuple(full))
    buffers = tuple(Buffer(name=b.name, slot=b.slot, shape=shape,
                           stride=contiguous_strides(shape), dtype=b.dtype) for b in node.buffers)
    return ComputedBuffer(buffers=buffers, body=Pointwise(
        ranges=shape, dtype=body.dtype, inner_fn=inner_fn, origins=body.origins))


def drop_unread(steps: list, outputs: list) -> list:
    """The steps without the realized nodes whose buffers nothing reads (from the last step
    back, so that what only they read goes too). Lowering can leave such nodes behind when a
    later proof removes their reader: an attention mask realized before its SDPA call was
    given none instead (codegen/attention.py), and GPT-2's position ids that only the mask
    read. Extern and view steps stay: only loop IR is known to do nothing but write."""
    live = {f"buf{o.slot}" for o in outputs if o.slot is not None}
    kept = []
    for step in reversed(steps):
        if isinstance(step, ComputedBuffer):
            if not live & {b.name for b in step.buffers}:
                continue
            live |= {name for name, _ in node_loads(step, len(node_prefix(step)))[0]}
        elif isinstance(step, Kernel):
            live |= step.reads
        else:
            live |= {f"buf{s}" for s in step.reads()}
        kept.append(step)
    return kept[::-1]


def schedule(steps: list) -> tuple[list, list]:
    """Group runs of ComputedBuffers (between extern steps) into Kernels.

    A node may join any kernel of the current run that comes no earlier than the last kernel
    producing something it reads: first the one it depends on (vertical fusion), then the
    others, latest first (horizontal fusion). A view step does not end a run (it computes
    nothing, and stays after the kernels before it): a node reading a view depends on the
    kernel writing the view's base, and is not fused into it nor into any kernel placed
    before the view. Returns (steps, decisions).
    """
    out, decisions, run = [], [], []
    views, made = {}, {}     # view buffer -> its base; -> kernels in the run before it
    count = 0
    for step in steps:
        if isinstance(step, Kernel):    # written by hand (codegen/triton/decode_attention.py)
            step.name = f"kernel{count}"
            count += 1
        if isinstance(step, CallStep) and step.kind is StepKind.VIEW:
            base = f"buf{step.reads()[0]}"
            for o in (o for o in step.out if o is not None):
                views[f"buf{o}"], made[f"buf{o}"] = views.get(base, base), len(run)
            out.append(step)
            continue
        if not isinstance(step, ComputedBuffer):
            run, views, made = [], {}, {}
            out.append(step)
            continue
        placed = False
        for i in _candidates(step, run, views, made):
            ok, why = can_fuse(run[i], step, views)
            same = None if ok else reshaped(step, run[i].prefix)
            if same is not None and (fits := can_fuse(run[i], same, views))[0]:
                step, (ok, why) = same, fits
            if ok:
                run[i].nodes.append(step)
                run[i].reasons.append("fused " + why)
                decisions.append(f"{run[i].name}: fused {why}")
                placed = True
                break
            decisions.append(f"{run[i].name}: not fused {why}")
        if not placed:
            k = Kernel(name=f"kernel{count}", prefix=node_prefix(step), nodes=[step])
            count += 1
            k.reasons.append(f"starts with {step.buffers[0].name} "
                             f"({'+'.join(step.body.origins)}), rows {list(k.prefix)}")
            run.append(k)
            out.append(k)
    return out, decisions


def _candidates(node: ComputedBuffer, run: list, views: dict, made: dict) -> list[int]:
    """The kernels of `run` that `node` may join, in the order to try them: none before the
    last that writes what it reads (that one first), none before a view it reads (they run
    before the view exists), then the rest, latest first."""
    names = {n for n, _ in node_loads(node, len(node_prefix(node)))[0]}
    floor = max((made[n] for n in names if n in made), default=0)
    bases = {views.get(n, n) for n in names}
    deps = [i for i, k in enumerate(run) if i >= floor and bases & {b.name for b in k.writes}]
    first = max(deps, default=floor)
    return ([first] if deps else []) + [i for i in range(len(run) - 1, first - 1, -1)
                                        if i not in deps[-1:]]
