"""Prologues: a pointwise value that a hand-written kernel computes where it would load it.

A decode step's rotary embedding is a kernel of its own between the q/k/v product and the
attention: a few programs that load the product's rows, rotate them and store q and the new key,
which the attention's programs load right after. On an H100 each such kernel cost 2.8 us of a
LLaMA-1B step in latency alone (benchmarks/results/h100-generate/marginal/), for no bytes worth
the name. A `Prologue` instead hands the attention kernel the value's loop-IR body: the kernel's
source gets a `@triton.jit` helper, printed by the same code as generated kernels
(codegen/triton/kernel.py), that computes the value's rows given as an [XBLOCK, 1] block of
row indices, and the kernel calls it where it loaded them. The rows it reads are loads from
buffers earlier kernels wrote (the product, the cos/sin tables at the position), so the value
is computed, not stored and loaded: same roundings (the result is rounded to the value's dtype,
as a store would), same index checks (into the kernel's error code).

Only where every size is static (decode) and the value is pointwise over buffers; the helper's
name is fixed, so layers' kernels stay of one shape (build.kernel_shape).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import sympy

from aotc.codegen.ir import Buffer, ComputedBuffer, Pointwise, contiguous_strides, index_vars
from aotc.codegen.scheduler import Kernel, node_loads
from aotc.codegen.triton.blocks import KernelBlocks, NodeBlock, pow2
from aotc.codegen.triton.kernel import XR, KernelWriter, TritonHandler
from aotc.codegen.triton.printer import texpr, unravel, value_type

HELPER = "aotc_prologue"


@dataclass
class Prologue:
    """The value [*rows, D] of `node` (a Pointwise over static sizes; its buffer is a name
    only, never allocated nor stored), computed by the kernel that reads it."""
    node: ComputedBuffer
    rblock: int = 0       # the R block the kernel calls it with (0: the row's, rounded up)

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
class HelperSource:
    text: str            # the helper's `@triton.jit` function
    params: list         # its buffer parameters, in order (aotc_err last where it checks)
    uses_err: bool       # it stores `error_code` into aotc_err for an index out of range

    def call(self, rows: str, xblock: int, rblock: int) -> str:
        """The call computing the rows `rows` (an [xblock, 1] block of row indices): an
        [xblock, rblock] block of the value, 0 outside it."""
        return f"{HELPER}({', '.join(self.params)}, {rows}, {xblock}, {rblock})"


class _HelperWriter(KernelWriter):
    """A KernelWriter for one pointwise node whose rows come in as a parameter, returning
    the value instead of storing it: XBLOCK rows (any, masked to the value's), one R block
    holding a whole row."""

    def __init__(self, prologue: Prologue, buffers: dict, error_code: int):
        shape = prologue.shape
        kernel = Kernel(name=HELPER, prefix=shape[:-1], nodes=[prologue.node])
        super().__init__(kernel, buffers, set(), error_code)
        d = int(shape[-1])
        size = max(prologue.rblock, pow2(d))
        rows = sympy.Integer(1)
        for n in shape[:-1]:
            rows *= n
        self.blocks = KernelBlocks(
            rows=rows, xblock=1, xmask=True, wide=False, split=False, num_warps=1,
            nodes=[NodeBlock("R0_BLOCK", size, shape[-1], "single",
                             None if size == d else "rmask0")])

    def helper(self) -> HelperSource:
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
             f"tl.broadcast_to({self.stored_value(value, buf.dtype)}, [XBLOCK, R0_BLOCK])")
        lines.append(f"return tl.where({mask}, {v}, 0.0)" if mask else f"return {v}")
        rows = [f"xmask = xindex < {texpr(self.blocks.rows)}",
                *unravel("xindex", [p.name for p in self.pvars], self.k.prefix)]
        text = "\n".join(rows + lines)
        if re.search(r"\bs_\w+", text):
            raise ValueError("a prologue's sizes must be static")
        params = [n for n in dict.fromkeys(re.findall(r"\bbuf\d+\b", text))]
        params += ["aotc_err"] if self.uses_err else []
        head = (f"@triton.jit\ndef {HELPER}({', '.join(params)}, xindex, "
                "XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):\n")
        return HelperSource(head + "".join(f"    {ln}\n" for ln in rows + lines) + "\n\n",
                            params, self.uses_err)


def prologue_helper(prologue: Prologue, buffers: dict, error_code: int) -> HelperSource:
    """The helper computing `prologue`'s value, its index checks storing `error_code`."""
    return _HelperWriter(prologue, buffers, error_code).helper()
