"""Runtime guards: the checks an input must pass before a plan runs.

Guards come from the typed manifest (artifact/schema/manifest.py): per input a dtype, a rank and
one entry per dim, either an integer (a static size) or a parsed size expression (`batch`,
`2*seq`); per symbol a closed range; and relations between symbols (`seq % 8 == 0`). Expressions
were parsed by the schema's grammar (integers, declared symbols, + - * // % min max, no powers)
and are evaluated by walking their nodes, so evaluation is bounded by the expression's size and
the runtime needs neither sympy nor `eval`. Inputs must be dense strided tensors: sparse,
nested, quantized or meta tensors are refused here, before any kernel reads their memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from aotc.errors import GuardError
from aotc.artifact.dtypes import DTYPES
from aotc.artifact.schema import expr as ex


@dataclass(frozen=True, slots=True)
class InputGuard:
    index: int
    name: str
    dtype: torch.dtype
    shape: tuple  # int | expr node per dim

    @property
    def spec(self) -> str:
        dims = ", ".join(str(d) if isinstance(d, int) else ex.text(d) for d in self.shape)
        return f"{str(self.dtype).removeprefix('torch.')}[{dims}]"


def _is_name(d) -> bool:
    return isinstance(d, ex.Sym)


class Guards:
    """All guards of one entry point; `check(args, device)` returns the bound symbol values."""

    def __init__(self, inputs, symbols: dict, relations=()):
        self.inputs = [InputGuard(i, spec.name, DTYPES[spec.dtype], tuple(spec.shape))
                       for i, spec in enumerate(inputs)]
        self.symbols = {n: (s.min, s.max) for n, s in symbols.items()}
        self.relations = tuple(relations)
        binders: dict[str, tuple[int, int]] = {}   # symbol: (input, dim) it is first read from
        for g in self.inputs:
            for dim, want in enumerate(g.shape):
                if _is_name(want):
                    binders.setdefault(want.name, (g.index, dim))
        self._binders = tuple((name, i, dim) for name, (i, dim) in binders.items())

    @property
    def bound_symbols(self) -> set[str]:
        """The symbols a call binds (each read from an input dim)."""
        return {name for name, _, _ in self._binders}

    def bind(self, args: tuple) -> dict[str, int]:
        """The symbols' values read from the inputs' sizes, nothing checked: what a call
        with `check_guards=False` still needs (plans size buffers and grids from them)."""
        return {name: args[i].shape[dim] for name, i, dim in self._binders}

    def check(self, args: tuple, device: torch.device) -> dict[str, int]:
        if len(args) != len(self.inputs):
            names = ", ".join(g.name for g in self.inputs)
            raise GuardError(f"wrong number of inputs: expected {len(self.inputs)}, got {len(args)}",
                             where="call arguments", expected=f"{len(self.inputs)} ({names})",
                             found=len(args), fix=f"call the module with ({names})")
        bound: dict[str, int] = {}
        derived: list[tuple[InputGuard, int, object, int]] = []
        for guard, value in zip(self.inputs, args):
            self._check_tensor(guard, value, device, bound, derived)
        self._check_symbols(bound, derived)
        return bound

    def _check_tensor(self, g: InputGuard, t, device: torch.device, bound: dict,
                      derived: list) -> None:
        where = f"input {g.name!r} (#{g.index})"
        if not isinstance(t, torch.Tensor):
            raise GuardError(f"{where} is not a tensor", where=where, expected=f"a tensor {g.spec}",
                             found=type(t).__name__, fix=f"pass a torch.Tensor {g.spec}")
        if t.dtype != g.dtype:
            raise GuardError(f"{where} has dtype {t.dtype}, expected {g.dtype}", where=where,
                             expected=g.dtype, found=t.dtype, fix=f"convert it with .to({g.dtype})")
        if t.device.type != device.type:
            raise GuardError(f"{where} is on {t.device}, expected {device.type}", where=where,
                             expected=device.type, found=str(t.device),
                             fix=f"move it with .to('{device}') or load the artifact with "
                                 f"device='{t.device}'")
        _check_kind(t, where)
        if t.dim() != len(g.shape):
            raise GuardError(f"{where} has rank {t.dim()}, expected {len(g.shape)} ({g.spec})",
                             where=where, expected=f"rank {len(g.shape)}: {g.spec}",
                             found=f"rank {t.dim()}: {list(t.shape)}",
                             fix=f"pass a tensor of shape {g.spec}")
        for dim, (want, size) in enumerate(zip(g.shape, t.shape)):
            if isinstance(want, int):
                if size != want:
                    raise GuardError(
                        f"{where} dim {dim} has size {size}, expected {want}",
                        where=f"{where}, dim {dim}", expected=want, found=size,
                        fix=f"pass a tensor of shape {g.spec}; this dim was static at export "
                            "(declare it dynamic at export to accept other sizes)")
            elif _is_name(want):
                if bound.setdefault(want.name, size) != size:
                    name = want.name
                    raise GuardError(
                        f"{where} dim {dim} is {name}={size}, but {name}={bound[name]} elsewhere",
                        where=f"{where}, dim {dim}", expected=f"{name} = {bound[name]}",
                        found=size, fix=f"every dim named {name} must have the same size")
            else:
                derived.append((g, dim, want, size))

    def _check_symbols(self, bound: dict, derived: list) -> None:
        for name, size in bound.items():
            rng = self.symbols.get(name)
            if rng and not rng[0] <= size <= rng[1]:
                where = self._where(name)
                raise GuardError(f"{where}: {name}={size} is outside its range "
                                 f"[{rng[0]}, {rng[1]}]", where=where,
                                 expected=f"{rng[0]} <= {name} <= {rng[1]}", found=size,
                                 fix=f"pass a size in [{rng[0]}, {rng[1]}] or re-export "
                                     "with a wider range")
        for g, dim, node, size in derived:
            expect = _evaluate(node, bound)
            if expect != size:
                where = f"input {g.name!r} (#{g.index}), dim {dim}"
                text = ex.text(node)
                raise GuardError(f"{where} has size {size}, expected {text} = {expect}",
                                 where=where, expected=f"{text} = {expect}", found=size,
                                 fix=f"this dim must equal {text}")
        for node in self.relations:
            if not _evaluate(node, bound):
                text = ex.text(node)
                raise GuardError(f"input sizes break the relation {text}", where=text,
                                 expected=text,
                                 found=", ".join(f"{k}={v}" for k, v in bound.items()),
                                 fix="choose sizes that satisfy the relation")

    def _where(self, symbol: str) -> str:
        for g in self.inputs:
            for dim, want in enumerate(g.shape):
                if _is_name(want) and want.name == symbol:
                    return f"input {g.name!r} (#{g.index}), dim {dim}"
        return f"symbol {symbol}"


def _evaluate(node, bound: dict):
    try:
        return ex.evaluate(node, bound)
    except ZeroDivisionError:
        raise GuardError(f"the size expression {ex.text(node)} divides by zero at these sizes",
                         where=ex.text(node), expected="a non-zero divisor",
                         found=", ".join(f"{k}={v}" for k, v in bound.items()),
                         fix="choose other input sizes") from None


def _check_kind(t: torch.Tensor, where: str) -> None:
    """Only dense strided tensors with real storage reach a plan."""
    if t.layout != torch.strided or t.is_nested:
        raise GuardError(f"{where} has layout {t.layout}, expected a dense (strided) tensor",
                         where=where, expected="torch.strided", found=str(t.layout),
                         fix="pass a dense tensor (e.g. .to_dense())")
    if t.is_quantized or t.is_meta:
        kind = "quantized" if t.is_quantized else "meta"
        raise GuardError(f"{where} is a {kind} tensor", where=where,
                         expected="a tensor with real, plain values", found=kind,
                         fix="pass a plain tensor (dequantize, or materialize a meta tensor)")
