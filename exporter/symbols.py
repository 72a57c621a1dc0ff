"""Symbolic sizes: export's shape symbols renamed to the user's dim names, printed as the
Python-syntax integer expressions that Programs, plans and manifests carry ("2*seq", "batch")."""
from __future__ import annotations

import sympy


class SymbolNamer:
    def __init__(self, names: dict | None = None):
        self.names = dict(names or {})        # sympy Symbol -> user name

    def expr(self, e) -> str:
        """Python source for a sympy (or torch SymInt) integer expression."""
        if hasattr(e, "node"):                # torch.SymInt
            e = e.node.expr
        return self._print(sympy.sympify(e))

    def _print(self, e) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return self.names.get(e, e.name)
        name = type(e).__name__
        if name in ("floor", "ceiling") and len(e.args) == 1:   # of a quotient: floor(seq/2)
            num, den = sympy.together(e.args[0]).as_numer_denom()
            num, den = self._print(sympy.expand(num)), self._print(den)
            return f"({num} // {den})" if name == "floor" else f"(-((-{num}) // {den}))"
        args = [self._print(a) for a in e.args]
        if e.is_Add:
            return "(" + " + ".join(args) + ")"
        if e.is_Mul:
            return "(" + "*".join(args) + ")"
        if e.is_Pow and e.args[1].is_Integer and int(e.args[1]) > 0:
            return "(" + "*".join([args[0]] * int(e.args[1])) + ")"
        if name in ("FloorDiv", "floor") and len(args) == 2:
            return f"({args[0]} // {args[1]})"
        if name in ("Mod", "PythonMod", "ModIndex"):
            return f"({args[0]} % {args[1]})"
        if name in ("Max", "Min"):
            return f"{name.lower()}({', '.join(args)})"
        if name == "CeilToInt":
            num, den = e.args[0].as_numer_denom()
            return f"(-((-{self._print(num)}) // {self._print(den)}))"
        raise NotImplementedError(f"cannot print symbolic size {e!r}")
