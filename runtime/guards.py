"""Runtime guards: the checks an input must pass before a plan runs.

Guards come from the manifest: per input a dtype, a rank and one entry per dim, either an integer
(a static size) or a symbol expression string (`"batch"`, `"2*seq"`); per symbol a closed range;
and relations between symbols as Python-syntax boolean expressions (`"seq % 8 == 0"`). Symbol
expressions are compiled once, at load, by a small evaluator that accepts only integer arithmetic,
comparisons and min/max, so the runtime needs neither sympy nor `eval` of arbitrary text.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

import torch

from aotc.errors import ArtifactError, GuardError
from aotc.runtime.dtypes import DTYPES

_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Name, ast.Load,
            ast.Constant, ast.Call, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow,
            ast.USub, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.And, ast.Or,
            ast.Not)
_FUNCS = {"min": min, "max": max}


def compile_expr(text: str):
    """Compile a symbol expression to a code object, refusing anything but integer arithmetic."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        tree = None
    bad = tree is None or any(
        not isinstance(n, _ALLOWED)
        or (isinstance(n, ast.Constant) and not isinstance(n.value, int))
        or (isinstance(n, ast.Call) and getattr(n.func, "id", None) not in _FUNCS)
        for n in ast.walk(tree))
    if bad:
        raise ArtifactError(f"manifest holds an invalid symbol expression {text!r}",
                            expected="integer arithmetic over symbol names", found=text,
                            fix="re-export the model with this aotc")
    return compile(tree, "<guard>", "eval")


def evaluate(code, symbols: dict[str, int]):
    return eval(code, {"__builtins__": {}, **_FUNCS}, symbols)  # noqa: S307 - vetted by compile_expr


@dataclass(frozen=True, slots=True)
class InputGuard:
    index: int
    name: str
    dtype: torch.dtype
    shape: tuple  # int | str per dim


class Guards:
    """All guards of one entry point; `check(args, device)` returns the bound symbol values."""

    def __init__(self, inputs: list[dict], symbols: dict[str, dict], relations: list[str]):
        self.inputs = [InputGuard(i, spec["name"], DTYPES[spec["dtype"]], tuple(spec["shape"]))
                       for i, spec in enumerate(inputs)]
        self.symbols = symbols
        self.relations = [(text, compile_expr(text)) for text in relations]
        self._exprs = {d: compile_expr(d) for g in self.inputs for d in g.shape
                       if isinstance(d, str) and not d.isidentifier()}
        binders: dict[str, tuple[int, int]] = {}   # symbol: (input, dim) it is first read from
        for g in self.inputs:
            for dim, want in enumerate(g.shape):
                if isinstance(want, str) and want.isidentifier():
                    binders.setdefault(want, (g.index, dim))
        self._binders = tuple((name, i, dim) for name, (i, dim) in binders.items())

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
        derived: list[tuple[InputGuard, int, str, int]] = []
        for guard, value in zip(self.inputs, args):
            self._check_tensor(guard, value, device, bound, derived)
        self._check_symbols(bound, derived)
        return bound

    def _check_tensor(self, g: InputGuard, t, device: torch.device, bound: dict,
                      derived: list) -> None:
        where = f"input {g.name!r} (#{g.index})"
        spec = f"{str(g.dtype).removeprefix('torch.')}[{', '.join(map(str, g.shape))}]"
        if not isinstance(t, torch.Tensor):
            raise GuardError(f"{where} is not a tensor", where=where, expected=f"a tensor {spec}",
                             found=type(t).__name__, fix=f"pass a torch.Tensor {spec}")
        if t.dtype != g.dtype:
            raise GuardError(f"{where} has dtype {t.dtype}, expected {g.dtype}", where=where,
                             expected=g.dtype, found=t.dtype, fix=f"convert it with .to({g.dtype})")
        if t.device.type != device.type:
            raise GuardError(f"{where} is on {t.device}, expected {device.type}", where=where,
                             expected=device.type, found=str(t.device),
                             fix=f"move it with .to('{device}') or load the artifact with "
                                 f"device='{t.device}'")
        if t.dim() != len(g.shape):
            raise GuardError(f"{where} has rank {t.dim()}, expected {len(g.shape)} ({spec})",
                             where=where, expected=f"rank {len(g.shape)}: {spec}",
                             found=f"rank {t.dim()}: {list(t.shape)}",
                             fix=f"pass a tensor of shape {spec}")
        for dim, (want, size) in enumerate(zip(g.shape, t.shape)):
            if isinstance(want, int):
                if size != want:
                    raise GuardError(
                        f"{where} dim {dim} has size {size}, expected {want}",
                        where=f"{where}, dim {dim}", expected=want, found=size,
                        fix=f"pass a tensor of shape {spec}; this dim was static at export "
                            "(declare it dynamic at export to accept other sizes)")
            elif want.isidentifier():
                if bound.setdefault(want, size) != size:
                    raise GuardError(
                        f"{where} dim {dim} is {want}={size}, but {want}={bound[want]} elsewhere",
                        where=f"{where}, dim {dim}", expected=f"{want} = {bound[want]}",
                        found=size, fix=f"every dim named {want} must have the same size")
            else:
                derived.append((g, dim, want, size))

    def _check_symbols(self, bound: dict, derived: list) -> None:
        for name, size in bound.items():
            rng = self.symbols.get(name)
            if rng and not rng["min"] <= size <= rng["max"]:
                where = self._where(name)
                raise GuardError(f"{where}: {name}={size} is outside its range "
                                 f"[{rng['min']}, {rng['max']}]", where=where,
                                 expected=f"{rng['min']} <= {name} <= {rng['max']}", found=size,
                                 fix=f"pass a size in [{rng['min']}, {rng['max']}] or re-export "
                                     "with a wider range")
        for g, dim, text, size in derived:
            expect = evaluate(self._exprs[text], bound)
            if expect != size:
                where = f"input {g.name!r} (#{g.index}), dim {dim}"
                raise GuardError(f"{where} has size {size}, expected {text} = {expect}",
                                 where=where, expected=f"{text} = {expect}", found=size,
                                 fix=f"this dim must equal {text}")
        for text, code in self.relations:
            if not evaluate(code, bound):
                raise GuardError(f"input sizes break the relation {text}", where=text,
                                 expected=text, found=", ".join(f"{k}={v}" for k, v in bound.items()),
                                 fix="choose sizes that satisfy the relation")

    def _where(self, symbol: str) -> str:
        for g in self.inputs:
            for dim, want in enumerate(g.shape):
                if want == symbol:
                    return f"input {g.name!r} (#{g.index}), dim {dim}"
        return f"symbol {symbol}"
