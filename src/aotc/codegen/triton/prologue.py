"""Prologues: a pointwise value that a hand-written kernel computes where it would load it.

A decode step's rotary embedding is a kernel of its own between the q/k/v product and the
attention: a few programs that load the product's rows, rotate them and store q and the new key,
which the attention's programs load right after. On an H100 each such kernel cost 2.8 us of a
LLaMA-1B step in latency alone (benchmarks/results/h100-generate/marginal/), for no bytes worth
the name. A `Prologue` instead hands the attention kernel the value's loop-IR body, printed by
the same code as generated kernels (codegen/triton/kernel.py) as straight-line statements over
a block of row indices the kernel gives (`prologue_lines`), its names prefixed with the value's
so q's and the key's share the kernel. What they read are the product's rows and the cos/sin
tables at the position, so the value is computed, not stored and loaded: same roundings (the
result is rounded to the value's dtype, as a store would), same index checks (into the
kernel's error code). The statements that read no kernel's output (the position, the table
rows, index arithmetic) run before the kernel's PDL wait (build.hoist_early): after it only
the product's rows are loaded and rotated. (Called as a helper function after the wait, with
the position reloaded there and the table rows behind it, each of the 152 split programs paid
that chain, and a LLaMA-1B step was 3% slower than with the rotary kernel:
benchmarks/results/h100-generate/prologue/.)

Only where every size is static (decode) and the value is pointwise over buffers; the names
are fixed by the value's role, so layers' kernels stay of one shape (build.kernel_shape).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import sympy

from aotc.codegen.ir import Buffer, ComputedBuffer, Pointwise, contiguous_strides, index_vars
from aotc.codegen.scheduler import Kernel, node_loads
from aotc.codegen.triton.blocks import KernelBlocks, NodeBlock, pow2
from aotc.codegen.triton.build import ASSIGNMENT
from aotc.codegen.triton.kernel import XR, KernelWriter, TritonHandler
from aotc.codegen.triton.printer import stored_value, texpr, unravel, value_type
from aotc.errors import LoweringError

HELPER = "aotc_prologue"


@dataclass
class Prologue:
    """The value [*rows, D] of `node` (a Pointwise over static sizes; its buffer is a name
    only, never allocated nor stored), computed by the kernel that reads it."""
    node: ComputedBuffer

    @property
    def shape(self) -> tuple:
        return tuple(self.node.buffers[0].shape)

    @property
    def dtype(self):
        return self.node.buffers[0].dtype

    @property
    def reads(self) -> list[str]:
        """The buffers the body loads, in the order it first loads them."""
        loads = node_loads(self.node, len(self.shape) - 1)[0]
        return list(dict.fromkeys(name for name, _ in loads))


def make_prologue(name: str, shape, dtype, loader, origins=()) -> Prologue | None:
    """A Prologue for the value `loader` computes over `shape`, or None where a size is not
    static (the helper's blocks are fixed when the kernel is written)."""
    if not shape or not all(sympy.sympify(d).is_Integer for d in shape):
        return None
    shape = tuple(sympy.Integer(int(d)) for d in shape)
    buf = Buffer(name=name, slot=-1, shape=shape, stride=contiguous_strides(shape), dtype=dtype)
    body = Pointwise(ranges=shape, dtype=dtype, inner_fn=loader, origins=tuple(origins))
    return Prologue(ComputedBuffer(buffers=(buf,), body=body))


@dataclass(frozen=True)
class InlineSource:
    """A prologue's value as straight-line statements of the kernel that computes it."""
    lines: list          # top-level statements; the last assigns the value to its target
    params: list         # buffers they read (aotc_err aside), in first-use order
    uses_err: bool       # they store the kernel's error code into aotc_err for a bad index


class _InlineWriter(KernelWriter):
    """A KernelWriter for one pointwise node whose rows the calling kernel gives as an
    expression, printing its body as statements that assign the value instead of storing
    it: XBLOCK rows (any, masked to the value's), one R block holding a whole row."""

    def __init__(self, prologue: Prologue, buffers: dict, error_code: int, rblock: int):
        shape = prologue.shape
        kernel = Kernel(name=HELPER, prefix=shape[:-1], nodes=[prologue.node])
        super().__init__(kernel, buffers, set(), error_code)
        d = int(shape[-1])
        size = max(rblock, pow2(d))
        rows = sympy.Integer(1)
        for n in shape[:-1]:
            rows *= n
        self.blocks = KernelBlocks(
            rows=rows, xblock=1, xmask=True, wide=False, split=False, num_warps=1,
            nodes=[NodeBlock("R0_BLOCK", size, shape[-1], "single",
                             None if size == d else "rmask0")])

    def body(self) -> tuple[list, str]:
        """The statements over `xindex` rows, XBLOCK and R0_BLOCK, and the value's expression
        ([XBLOCK, R0_BLOCK], 0 outside the value)."""
        node = self.k.nodes[0]
        body, buf = node.body, node.buffers[0]
        xvars = index_vars("x0_", 1)
        ranges = {**self.ranges, **dict(zip(xvars, body.ranges[-1:]))}
        _, lines = self._chunk(0, [v.name for v in xvars], body.ranges[-1:])
        h = TritonHandler(self, self._scope(0, xvars), ranges, lines)
        value = body.inner_fn(h, self.pvars + xvars)
        self._note_reads(h)
        mask, _ = h.mask_for(XR)
        v = (f"tl.full([XBLOCK, R0_BLOCK], {value.expr}, {value_type(buf.dtype)})"
             if value.const is not None else
             f"tl.broadcast_to({stored_value(value, buf.dtype)}, [XBLOCK, R0_BLOCK])")
        rows = [f"xmask = xindex < {texpr(self.blocks.rows)}",
                *unravel("xindex", [p.name for p in self.pvars], self.k.prefix)]
        return rows + lines, (f"tl.where({mask}, {v}, 0.0)" if mask else v)


def prologue_lines(prologue: Prologue, buffers: dict, error_code: int, *, target: str,
                   rows: str, xblock: int, rblock: int) -> InlineSource:
    """`prologue`'s value for the rows `rows` (an [xblock, 1] block of row indices) as
    statements ending in `target = <[xblock, rblock] block, 0 outside the value>`; its own
    names take `target`'s as a prefix, so several prologues share a kernel; its index checks
    store `error_code`."""
    writer = _InlineWriter(prologue, buffers, error_code, rblock)
    body, value = writer.body()
    lines = [f"xindex = {rows}", *body, f"{target} = {value}"]
    if any(ln.startswith((" ", "\t")) or ln.rstrip().endswith(":") for ln in lines):
        raise _bug(prologue, "straight-line statements", "a loop or a branch")
    names = {m.group(1) for ln in lines[:-1] if (m := ASSIGNMENT.match(ln))}
    local = re.compile(r"(?<![\w.])(" + "|".join(sorted(names, key=len, reverse=True)) +
                       r")\b") if names else None
    sized = {"XBLOCK": str(xblock), "R0_BLOCK": str(rblock)}
    out = []
    for ln in lines:
        ln = re.sub(r"\b(XBLOCK|R0_BLOCK)\b", lambda m: sized[m.group(1)], ln)
        out.append(local.sub(lambda m: f"{target}_{m.group(1)}", ln) if local else ln)
    text = "\n".join(out)
    if re.search(r"\bs_\w+", text):
        raise _bug(prologue, "static sizes", "a size parameter")
    params = list(dict.fromkeys(re.findall(r"\bbuf\d+\b", text)))
    return InlineSource(out, params, writer.uses_err)


def _bug(prologue: Prologue, expected: str, found: str) -> LoweringError:
    name = prologue.node.buffers[0].name
    return LoweringError(f"prologue {name} cannot be computed inside its kernel", where=name,
                         expected=expected, found=found, fix="report this as an aotc bug")
