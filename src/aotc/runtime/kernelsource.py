"""What a Triton kernel source of an artifact may contain before `interpret=True` runs it.

Under Triton's interpreter a kernel's source runs as Python, so it is checked first against the
shape aotc writes (codegen/triton): a docstring, the imports of triton, triton.language and
libdevice, and `@triton.jit` functions; inside them only assignments, arithmetic, comparisons,
if/for/while/return, calls, subscripts and attribute reads, where every name is a parameter, a
local, one of the module's functions, `tl`, `triton`, `libdevice` or a few builtins, and no
attribute starts with an underscore. Anything else (another import, a module-level call, a
class, `exec`, `__class__`, `open`) is refused with the line it is on.
"""
from __future__ import annotations

import ast

from aotc.errors import ArtifactError

ROOTS = frozenset({"tl", "triton", "libdevice", "range", "min", "max", "float", "int", "len",
                   "abs", "True", "False", "None"})
IMPORTS = {("triton", None), ("triton.language", "tl")}
FROM_IMPORTS = {("triton.language.extra", "libdevice"), ("triton.language.extra.cuda",
                                                          "libdevice")}
ALLOWED = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.If, ast.For,
           ast.While, ast.Break, ast.Continue, ast.Pass, ast.BinOp, ast.UnaryOp, ast.BoolOp,
           ast.Compare, ast.Call, ast.Attribute, ast.Subscript, ast.Slice, ast.Name, ast.Constant,
           ast.Tuple, ast.List, ast.IfExp, ast.keyword, ast.arguments, ast.arg, ast.Load,
           ast.Store, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context)


def check_kernel_source(text: str, where: str) -> None:
    def bad(node, why: str):
        raise ArtifactError(f"{where} is not a Triton kernel aotc writes: {why} (line "
                            f"{getattr(node, 'lineno', '?')})", where=where,
                            expected="imports of triton and @triton.jit functions only",
                            found=why, fix="re-export the model; never run an artifact's "
                                           "sources you do not trust")
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        raise ArtifactError(f"{where} does not parse as Python", where=where,
                            expected="a Triton kernel", found="a syntax error",
                            fix="re-export the model") from None
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in tree.body:
        if isinstance(node, ast.Import):
            if any((a.name, a.asname) not in IMPORTS for a in node.names):
                bad(node, "an import of another module")
        elif isinstance(node, ast.ImportFrom):
            if any((node.module, a.name) not in FROM_IMPORTS or a.asname for a in node.names):
                bad(node, "an import of another module")
        elif isinstance(node, ast.FunctionDef):
            _check_function(node, functions, bad)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str)):
            bad(node, f"a module-level {type(node).__name__}")


def _check_function(fn: ast.FunctionDef, functions: set, bad) -> None:
    deco = fn.decorator_list
    if len(deco) != 1 or ast.unparse(deco[0]) != "triton.jit":
        bad(fn, f"function {fn.name} is not decorated with @triton.jit alone")
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    if fn.args.vararg or fn.args.kwarg:
        bad(fn, f"function {fn.name} takes *args or **kwargs")
    local = {t.id for n in ast.walk(fn) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Store) for t in [n]}
    names = params | local | functions | ROOTS
    for a in fn.args.defaults + fn.args.kw_defaults:
        if a is not None and not isinstance(a, ast.Constant):
            bad(fn, "a default that is not a constant")
    for n in (x for stmt in fn.body for x in ast.walk(stmt)):
        if not isinstance(n, ALLOWED):
            bad(n, f"a {type(n).__name__} inside {fn.name}")
        if isinstance(n, ast.Name) and n.id not in names:
            bad(n, f"the name {n.id!r}")
        if isinstance(n, ast.Attribute) and n.attr.startswith("_"):
            bad(n, f"the attribute {n.attr!r}")
