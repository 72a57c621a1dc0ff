"""The lowering registry: one small function per ATen overload, building loop IR.

A lowering is called as `fn(g, metas, *args, **kwargs)`: `g` is the GraphLowering (it creates IR
values: `g.pointwise`, `g.reduction`, `g.view`), `metas` the traced output metadata (shape, dtype,
stride) of the node, and args are the node's arguments with tensors as `TensorValue`s. It returns
the output value(s), or None to leave the node to an extern ATen call (e.g. an argument
combination it does not handle). Registering an op twice is an error.
"""
from __future__ import annotations

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from aotc.codegen.ir import Op, sym

LOWERINGS: dict = {}
Promotion = ELEMENTWISE_TYPE_PROMOTION_KIND


def register(*ops):
    def deco(fn):
        for op in ops:
            if op in LOWERINGS:
                raise RuntimeError(f"duplicate lowering for {op}")
            LOWERINGS[op] = fn
        return fn
    return deco


def is_tensor(x) -> bool:
    from aotc.codegen.graph import TensorValue
    return isinstance(x, TensorValue)


def size_args(shape) -> list:
    """A shape as ATen call arguments in a plan: ints, or {"sym": expr} for symbolic sizes."""
    from aotc.exporter.symbols import SymbolNamer
    namer = SymbolNamer()
    return [int(d) if getattr(d, "is_Integer", True) else {"sym": namer.expr(d)} for d in shape]


def out_shape(metas, i: int = 0) -> tuple:
    return tuple(sym(d) for d in metas[i]["shape"])


def out_dtype(metas, i: int = 0) -> torch.dtype:
    return getattr(torch, metas[i]["dtype"])


def broadcast(tv, shape):
    """Loader of `tv` read at indices of the (broadcast) output `shape`."""
    offset = len(shape) - len(tv.shape)
    keep = [(j + offset) if not (tv.shape[j] == 1 and shape[j + offset] != 1) else None
            for j in range(len(tv.shape))]
    load = tv.loader
    return lambda h, idx: load(h, tuple(idx[k] if k is not None else sym(0) for k in keep))


def is_size(x) -> bool:
    """A scalar argument that is a symbolic size (`x / x.shape[-1]` at a dynamic dim)."""
    return isinstance(x, sympy.Expr) and not x.is_number


def compute_dtypes(kind, args) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) by torch's elementwise type promotion (a symbolic
    size promotes as the int it is)."""
    fake = [torch.empty([1] * len(a.shape), dtype=a.dtype, device="meta") if is_tensor(a)
            else (2 if a.is_integer else 2.0) if is_size(a) else a for a in args]
    return elementwise_dtypes(*fake, type_promotion_kind=kind)


def operand(a, shape, dtype):
    """Loader for a tensor or scalar argument, cast to `dtype`; a symbolic size is read from
    the kernel's size arguments at run time."""
    if is_tensor(a):
        load = broadcast(a, shape)
        return lambda h, idx: h.to_dtype(load(h, idx), dtype)
    if is_size(a):
        num, den = sympy.fraction(sympy.together(a))
        if den == 1:
            return lambda h, idx: h.index_expr(a, dtype)
        f64 = torch.float64    # a ratio of sizes (F.interpolate's scale), as torch's double
        return lambda h, idx: h.to_dtype(h.op(Op.TRUEDIV, h.index_expr(num, f64),
                                              h.index_expr(den, f64)), dtype)
    return lambda h, idx: h.constant(a, dtype)


from aotc.codegen.lowering import pointwise, reductions, views, misc, decode, matvec  # noqa: E402,F401
