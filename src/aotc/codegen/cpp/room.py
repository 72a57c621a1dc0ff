"""The room check at the top of every generated C++ kernel (format >= 17).

A kernel indexes each pointer argument by the layout it was compiled for: element
`1 + sum((size - 1) * stride)` past the pointer is the last it may touch (none if a dim is
empty). The plan says how large each buffer is, and a plan is data: a damaged or hostile one
whose slot is smaller than its kernel's buffer would have the kernel read or write past the
memory a runner allocated for it. So the runner passes, in `aotc_room`, how many elements each
pointer has up to the end of its storage (pointers in argument order, then as many free
entries); the kernel compares them with its extents before it touches memory, and on a
shortfall stores the extent it needed at `aotc_room[n + i]` and returns `-1 - i` (argument
`i`), which the runners (runtime/executor.py, runtime/cpp/program.cpp) raise as an
ArtifactError naming the slot. Extents are computed in doubles: exact below 2**53 elements, and
larger (never wrapping around) beyond, where no storage reaches.

The library's table says which kernels take the room (ROOM_MARKER after their pointer dtypes),
so a runner learns it from the verified library, never from the plan.
"""
from __future__ import annotations

import sympy

from aotc.codegen.cpp.printer import cexpr
from aotc.artifact.format import ROOM_MARKER

ROOM_PARAM = "int64_t* __restrict__ aotc_room"
__all__ = ["ROOM_MARKER", "ROOM_PARAM", "room_check"]


def _is_polynomial(e) -> bool:
    return all(a.is_Symbol or a.is_Number for a in sympy.preorder_traversal(e)
               if not (a.is_Add or a.is_Mul or a.is_Pow))


def _double(e, wide: dict) -> str:
    """`e` printed as double arithmetic: its size symbols read as doubles (`wide`), so a
    product of sizes cannot wrap around; an expression with divisions as int64, converted."""
    if e.is_Integer:
        return f"{int(e)}.0"
    if not _is_polynomial(e):
        return f"(double){cexpr(e)}"
    for s in e.free_symbols:
        wide.setdefault(s.name, sympy.Symbol(f"aotc_w_{s.name}", integer=True))
    return cexpr(e.xreplace({s: wide[s.name] for s in e.free_symbols}))


def extent(shape, stride, wide: dict) -> str:
    """The C++ double expression of the elements a buffer of `shape` and `stride` spans."""
    shape = [sympy.sympify(d) for d in shape]
    stride = [sympy.sympify(s) for s in stride]
    if any(d.is_Integer and int(d) <= 0 for d in shape):
        return "0.0"
    span = sympy.Integer(1) + sum(((d - 1) * s for d, s in zip(shape, stride)), sympy.Integer(0))
    span = sympy.expand(span)
    text = _double(span, wide)
    dynamic = [d for d in shape if not d.is_Integer]
    if not dynamic:
        return text
    empty = " || ".join(f"{_double(d, wide)} <= 0.0" for d in dynamic)
    return f"(({empty}) ? 0.0 : {text})"


def room_check(buffers: list) -> list[str]:
    """The statements that refuse a call whose buffers have less room than the kernel indexes;
    `buffers`: the pointer arguments, in order."""
    wide: dict = {}
    needs = [extent(b.shape, b.stride, wide) for b in buffers]
    n = len(buffers)
    decls = [f"const double {w.name} = (double)s_{name};" for name, w in sorted(wide.items())]
    return ["{   // the room the runner gives each pointer, against the extents indexed here",
            *["    " + d for d in decls],
            f"    const double aotc_need[{n}]{{{', '.join(needs)}}};",
            f"    if (int aotc_short = aotc_room_short(aotc_room, aotc_need, {n})) "
            "return aotc_short;",
            "}"]
