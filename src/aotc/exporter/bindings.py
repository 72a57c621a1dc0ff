"""Value-dependent sizes: the size symbols an op's result defines (`x[mask]`, `nonzero`,
`.item()`), which export calls unbacked (u0, u1, ...).

A plan sizes buffers from symbols; most are read from the inputs' dims before the first step,
these are read from the result of the call that defines them (the call step's `binds`), and the
runtime checks each against the range export proved for it before any later step uses it. Export
also asserts facts about them (`u0 <= 16`): an assertion that the symbols' ranges imply (by
value-range arithmetic, or case by case over a Min or Max: `implied`) is dropped, any other is
refused, since plans cannot check it.
"""
from __future__ import annotations

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._pytree import SequenceKey

from aotc.errors import ExportError
from aotc.exporter.symbols import SymbolNamer

MAX_SIZE = 1 << 40        # the manifest's largest size (artifact/schema/manifest.py MAX_DIM)
EXAMPLE = 1024            # the size block heuristics assume where export proved no bound


def bindings(node, namer: SymbolNamer, bound: dict, allowed: bool) -> dict | None:
    """{symbol name: [result position, dim or None]} for the unbacked symbols `node` defines
    (None where it defines none); each one's range goes into `bound`. Where value-dependent
    sizes are not `allowed` (training, decode entries), or a symbol sits where plans cannot
    read it (a stride, an offset), an ExportError."""
    found = node.meta.get("unbacked_bindings")
    if not allowed:
        if found or free_unbacked_symbols(node.meta.get("val")):
            _refuse(node, "this entry's buffers must be sized from its inputs' sizes alone")
        return None
    if not found:
        return None
    out: dict = {}
    for symbol, path in found.items():
        where = _position(path, isinstance(node.meta.get("val"), (tuple, list)))
        if where is None:
            _refuse(node, f"{symbol} is {path}, not a dim of the result")
        name = _name(symbol, namer)
        out[name] = list(where)
        bound[name] = _range(symbol, node)
    return out


def _position(path: tuple, multiple: bool) -> tuple | None:
    """(result position, dim or None for an integer result) of a key path, or None."""
    position = 0
    if multiple:
        if not path or not isinstance(path[0], SequenceKey):
            return None
        position, path = path[0].idx, path[1:]
    if not path:
        return position, None
    if len(path) == 2 and getattr(path[0], "name", None) == "size" \
            and isinstance(path[1], SequenceKey):
        return position, path[1].idx
    return None


def _name(symbol, namer: SymbolNamer) -> str:
    """Export's name (u0), unless a user's dim already has it."""
    if symbol not in namer.names:
        taken = set(namer.names.values())
        name, k = symbol.name, 0
        while name in taken:
            k += 1
            name = f"{symbol.name}_{k}"
        namer.names[symbol] = name
    return namer.names[symbol]


def _range(symbol, node) -> dict:
    vr = _shape_env(node).var_to_range.get(symbol)
    lo = max(0, int(vr.lower)) if vr is not None and _finite(vr.lower) else 0
    hi = min(int(vr.upper), MAX_SIZE) if vr is not None and _finite(vr.upper) else MAX_SIZE
    return {"min": lo, "max": max(lo, hi), "example": max(lo, min(hi, EXAMPLE))}


def _finite(v) -> bool:
    return getattr(v, "is_finite", True) and str(v) not in ("oo", "-oo", "int_oo", "-int_oo")


def _shape_env(node):
    for v in torch.utils._pytree.tree_leaves(node.meta.get("val")):
        for x in (v.shape if isinstance(v, torch.Tensor) else (v,)):
            if isinstance(x, torch.SymInt):
                return x.node.shape_env
    raise ExportError("a value-dependent size without its shape environment",
                      where=str(node.format_node())[:200], expected="a symbolic size",
                      found=str(node.meta.get("val"))[:100], fix="report this model")


def check_assertion(node) -> None:
    """An `_assert_scalar` on sizes: dropped where the symbols' proved ranges imply it
    (`u0 >= 0`), else an ExportError (no plan step checks it; guards check the inputs' dims)."""
    cond = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(cond, torch.SymBool):
        return
    from torch.utils._sympy.value_ranges import bound_sympy
    expr = cond.node.expr
    env = cond.node.shape_env
    ranges = {s: env.var_to_range[s] for s in expr.free_symbols if s in env.var_to_range}
    if implied(expr, ranges):
        return
    from aotc.exporter.program import node_source
    raise ExportError("the model asserts a fact about a size that aotc's plans cannot check",
                      where=node_source(node.meta.get("stack_trace"))
                      or str(node.format_node())[:200], expected="value-dependent sizes "
                      "checked only against their ranges", found=str(expr)[:200],
                      fix="drop the torch._check on that size, or compute with a fixed size "
                          "(torch.where over the whole tensor) instead")


def implied(fact, ranges: dict, depth: int = 4) -> bool:
    """Whether the symbols' `ranges` imply `fact` (a sympy relation). Value-range arithmetic
    first; where that is too coarse for a Min or Max (`Min(128, u0) <= u0`: the two terms'
    ranges are taken as independent), by cases: the term is each of its arguments in turn,
    under what that says of a lone symbol (`Min(128, u0) = 128` only where `u0 >= 128`), and
    every case must be implied (a case those bounds rule out holds vacuously)."""
    from torch.utils._sympy.value_ranges import bound_sympy
    if fact == sympy.true or bound_sympy(fact, ranges).lower == sympy.true:
        return True
    term = next((t for t in sympy.preorder_traversal(fact)
                 if type(t).__name__ in ("Min", "Max") and t.args), None)
    if term is None or depth == 0:
        return False
    smaller = type(term).__name__ == "Min"
    for arg in term.args:
        case = dict(ranges)
        for other in term.args:
            if other is not arg and not _narrow(case, arg, other, smaller):
                break        # this case cannot happen
        else:
            if not implied(fact.xreplace({term: arg}), case, depth - 1):
                return False
    return True


def _narrow(ranges: dict, low, high, smaller: bool) -> bool:
    """`ranges` narrowed by `low <= high` (swapped unless `smaller`), where one side is a lone
    symbol and the other a number; False if that leaves a symbol no value."""
    from torch.utils._sympy.value_ranges import ValueRanges
    low, high = (low, high) if smaller else (high, low)
    for sym, num, above in ((low, high, False), (high, low, True)):
        if isinstance(sym, sympy.Symbol) and getattr(num, "is_number", False) and sym in ranges:
            vr = ranges[sym]
            lo, hi = (sympy.Max(vr.lower, num), vr.upper) if above else \
                (vr.lower, sympy.Min(vr.upper, num))
            if (lo > hi) == sympy.true:
                return False
            ranges[sym] = ValueRanges(lo, hi)
    return True


def _refuse(node, why: str) -> None:
    from aotc.exporter.program import node_source
    at = node_source(node.meta.get("stack_trace"))
    raise ExportError(f"the output size of {node.target} depends on tensor values: {why}",
                      where=at or str(node.format_node())[:200],
                      expected="sizes that follow from the inputs' sizes (training and decode "
                               "entries), or a dim of an inference call's result",
                      found=f"{node.target} (boolean-mask indexing, nonzero, unique, ...)",
                      fix="select with torch.where or a fixed-size gather instead, or export the "
                          "part of the model before this line and run the rest eagerly")
