"""Symbolic sizes: export's shape symbols renamed to the user's dim names, printed as the
Python-syntax integer expressions that Programs, plans and manifests carry ("2*seq", "batch")."""
from __future__ import annotations

import sympy

from aotc.errors import ExportError


class SymbolNamer:
    def __init__(self, names: dict | None = None):
        self.names = dict(names or {})        # sympy Symbol -> user name

    def expr(self, e) -> str:
        """Python source for a sympy (or torch SymInt) integer expression."""
        if hasattr(e, "node"):                # torch.SymInt
            e = e.node.expr
        return self._print(exact_rational(sympy.sympify(e)))

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
        raise _unprintable(e)


def exact_rational(e):
    """`e` in plain sympy: torch's float casts and true divisions of sizes (`ToFloat`,
    `FloatTrueDiv`, `IntTrueDiv`) as sympy's, and each float constant as the exact rational it
    holds (a scale factor of 1.5 in `floor(1.5*W)` becomes 3/2, so the size is computed in
    integers, as torch's double product is for such factors). A float whose exact fraction
    has a denominator above 2**20 cannot be computed in 64-bit sizes: an ExportError."""
    from torch.utils._sympy.functions import FloatTrueDiv, IntTrueDiv, ToFloat, TruncToInt
    e = e.replace(ToFloat, lambda x: x).replace(FloatTrueDiv, lambda a, b: a / b) \
        .replace(IntTrueDiv, lambda a, b: a / b)
    e = e.replace(TruncToInt, lambda x: sympy.floor(x) if x.is_nonnegative else TruncToInt(x))
    floats = e.atoms(sympy.Float)
    if not floats:
        return e
    exact = {}
    for f in floats:
        p, q = float(f).as_integer_ratio()
        if q > 1 << 20:
            raise _unprintable(f)
        exact[f] = sympy.Rational(p, q)
    return e.xreplace(exact)


def _unprintable(e) -> ExportError:
    return ExportError("a size computed in a way plans cannot express", where=str(e)[:200],
                       expected="integer arithmetic on sizes (+, -, *, //, %, min, max) and "
                       "exact scale factors", found=str(e)[:200],
                       fix="compute the size in integers, or export the dim static")
