"""C++ kernel emission: one fused Kernel in, one `extern "C"` function out.

The loop IR bodies run with `CppHandler`, which prints each op as a C++ statement (common
subexpressions shared within a loop body). Loop nest: outer loops over the kernel's row prefix
(OpenMP-parallel), then per node its inner loops, the innermost contiguous and marked
`#pragma omp simd` so the compiler vectorizes it.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from aotc.codegen.shapes import first_use_order, size_names
from aotc.codegen.ir import (ARG_REDUCTIONS, PREDICATES, Buffer, Op, Reduction, ReductionType as R,
                             index_vars, linear_index, product, simplify_index)
from aotc.codegen.cpp.loopshape import column_nodes, merge_reduced_dims
from aotc.codegen.cpp.printer import HALF, STORAGE, cexpr, constant, op_expr, value_type
from aotc.codegen.cpp.room import ROOM_PARAM, room_check
from aotc.codegen.cpp.work import elements, threads_condition, worth_threads
from aotc.codegen.scheduler import Kernel

COLUMN_BLOCK = 64               # accumulators per column block of a column reduction


@dataclass(frozen=True, slots=True)
class CVal:
    expr: str
    dtype: torch.dtype
    inv: bool = False       # invariant in the node's inner loops (computed once, before them)


class CppHandler:
    """Ops handler that prints C++ into `lines`. Values that do not depend on the node's inner
    loop variables (`inner`) go to `pre`, emitted once before the inner loops: a row's
    statistics, an embedding row's index and its bounds check."""

    def __init__(self, buffers: dict, ranges: dict, locals_: dict, lines: list, counter: list,
                 inner: tuple = ()):
        self.buffers, self.ranges, self.locals = buffers, ranges, locals_
        self.lines, self.counter = lines, counter
        self.pre: list[str] = []
        self.inner = set(inner)           # inner loop vars, and runtime indices that vary
        self.hoist = True                 # off inside masked bodies (guarded loads stay put)
        self.cse: dict[str, str] = {}
        self.vectorizable = True
        self.read_names: set[str] = set()

    def _invariant(self, expr) -> bool:
        return self.hoist and not (sympy.sympify(expr).free_symbols & self.inner)

    def _var(self, expr: str, dtype, inv: bool = False, ctype: str | None = None) -> CVal:
        inv = inv and self.hoist
        if expr in self.cse:
            return CVal(self.cse[expr], dtype, inv)
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        (self.pre if inv else self.lines).append(f"{ctype or value_type(dtype)} {name} = {expr};")
        self.cse[expr] = name
        return CVal(name, dtype, inv)

    def load(self, name: str, index) -> CVal:
        index = simplify_index(index, self.ranges)
        buf = self.buffers[name]
        if name in self.locals:   # the value of this row (a dim of size 1 has index 0)
            row_index, var = self.locals[name]
            ones = {v: 0 for v, n in self.ranges.items() if n == 1}
            if sympy.expand((index - row_index).subs(ones)) == 0:
                return CVal(var, buf.dtype, True)
        self.read_names.add(name)
        access = f"{name}[{cexpr(index)}]"
        if buf.dtype == torch.bfloat16:
            access = f"aotc_bf16_to_float({access})"
        elif buf.dtype == torch.float16:
            access = f"(float)({access})"
        elif buf.dtype == torch.bool:   # bytes read as int: GCC vectorizes selects on them
            return self._var(f"reinterpret_cast<const uint8_t*>({name})[{cexpr(index)}]",
                             buf.dtype, self._invariant(index), ctype="int32_t")
        return self._var(access, buf.dtype, self._invariant(index))

    def constant(self, value, dtype) -> CVal:
        return CVal(constant(value, dtype), dtype, True)

    def index_expr(self, expr, dtype) -> CVal:
        expr = simplify_index(sympy.sympify(expr), self.ranges)
        return self._var(f"static_cast<{value_type(dtype)}>({cexpr(expr)})", dtype,
                         self._invariant(expr))

    def to_dtype(self, x: CVal, dtype) -> CVal:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._var(f"({x.expr} != 0)", dtype, x.inv)
        ct = value_type(dtype)
        cast = f"static_cast<{ct}>({x.expr})"
        if dtype == torch.bfloat16:
            cast = f"aotc_round_bf16({cast})"
        elif dtype == torch.float16:
            cast = f"aotc_round_fp16({cast})"
        return self._var(cast, dtype, x.inv)

    def op(self, op, *args: CVal) -> CVal:
        args = [a if isinstance(a, CVal) else self.constant(a, torch.float32) for a in args]
        dtype = torch.bool if op in PREDICATES else args[-1].dtype
        src = args[0].dtype if op in PREDICATES else dtype
        inv = all(a.inv for a in args)
        if op == Op.POW and dtype.is_floating_point:
            fast = _pow_by_constant(args[0].expr, args[1].expr, value_type(dtype))
            if fast is not None:
                return self._var(fast, dtype, inv)
        return self._var(op_expr(op, [a.expr for a in args], [a.dtype for a in args],
                                 value_type(src)), dtype, inv)

    def masked(self, mask: CVal, fn, other, dtype) -> CVal:
        other = other if isinstance(other, CVal) else self.constant(other, dtype)
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        self.lines.append(f"{value_type(dtype)} {name} = {other.expr};")
        self.lines.append(f"if ({mask.expr}) {{")
        outer_lines, outer_cse, outer_hoist = self.lines, self.cse, self.hoist
        self.lines, self.cse, self.hoist = [], dict(outer_cse), False
        value = self.to_dtype(fn(), dtype)
        body = self.lines + [f"{name} = {value.expr};"]
        self.lines, self.cse, self.hoist = outer_lines, outer_cse, outer_hoist
        self.lines += ["    " + ln for ln in body] + ["}"]
        return CVal(name, dtype)

    def bounded_index(self, expr, size):
        """A named index variable in [0, size): `x0 - 256` inside the mask `x0 >= 256` (a part
        of a `cat`) simplifies the view arithmetic of the loads that use it."""
        expr = simplify_index(sympy.sympify(expr), self.ranges)
        if not expr.free_symbols or (expr.is_Symbol and self.ranges.get(expr) == size):
            return expr
        value = self._var(cexpr(expr), torch.int64, self._invariant(expr))
        symbol = sympy.Symbol(value.expr, integer=True, nonnegative=True)
        self.ranges[symbol] = sympy.sympify(size)
        if not value.inv:
            self.inner.add(symbol)
        return symbol

    def indirect(self, value: CVal, size, wraps=True, op="aten::index.Tensor"):
        """A runtime index: wrapped if negative where `wraps`, checked against `size` (flags
        aotc_err; a negative index is out of range where it does not wrap, as in eager).
        Computed before the inner loops when it does not vary in them, so they still
        vectorize (an embedding row gathered contiguously)."""
        inv = value.inv and self.hoist
        name = f"i{self.counter[0]}"
        self.counter[0] += 1
        n = cexpr(sympy.sympify(size))
        (self.pre if inv else self.lines).extend([
            f"int64_t {name} = static_cast<int64_t>({value.expr});",
            *([f"if ({name} < 0) {name} += {n};"] if wraps else []),
            f"if ({name} < 0 || {name} >= {n}) {{ __atomic_store_n(&aotc_err, 1, "
            f"__ATOMIC_RELAXED); {name} = 0; }}"])
        symbol = sympy.Symbol(name, integer=True)
        if not inv:
            self.vectorizable = False
            self.inner.add(symbol)
        return symbol


def _pow_by_constant(x: str, exponent: str, ct: str) -> str | None:
    """x ** c for the constant exponents models use, without a libm call (which would stop
    vectorization): multiplications, sqrt, reciprocals."""
    try:
        c = float(exponent.rstrip("f"))
    except ValueError:
        return None
    forms = {1.0: x, 2.0: f"({x} * {x})", 3.0: f"({x} * {x} * {x})",
             4.0: f"(({x} * {x}) * ({x} * {x}))", 0.5: f"std::sqrt({x})",
             -1.0: f"({ct}(1) / {x})", -2.0: f"({ct}(1) / ({x} * {x}))",
             -0.5: f"({ct}(1) / std::sqrt({x}))"}
    return forms.get(c)


def _store(buf: Buffer, index, value: CVal) -> str:
    v = value.expr
    if buf.dtype == torch.bfloat16:
        v = f"aotc_float_to_bf16({v})"
    elif buf.dtype == torch.float16:
        v = f"static_cast<_Float16>({v})"
    elif value.dtype != buf.dtype:
        v = f"static_cast<{STORAGE[buf.dtype]}>({v})"
    return f"{buf.name}[{cexpr(index)}] = {v};"


def _loops(vars_, sizes, body: list, last: str | None, first: str | None = None) -> list:
    """A loop nest with an optional pragma before the innermost (`last`) or outermost loop."""
    out, pad = [], ""
    for k, (v, n) in enumerate(zip(vars_, sizes)):
        if k == 0 and first is not None:
            out.append(f"{pad}{first}")
        elif k == len(vars_) - 1 and last is not None:
            out.append(f"{pad}{last}")
        out.append(f"{pad}for (int64_t {v} = 0; {v} < {cexpr(n)}; ++{v}) {{")
        pad += "    "
    out += [pad + ln for ln in body]
    for _ in vars_:
        pad = pad[:-4]
        out.append(f"{pad}}}")
    return out


_ACC = {  # reduction -> (init(ct, float?), update(acc, v), omp reduction clause)
    R.SUM: (lambda ct, fp: f"{ct}(0)", lambda a, v: f"{a} = {a} + {v};", "+"),
    R.PROD: (lambda ct, fp: f"{ct}(1)", lambda a, v: f"{a} = {a} * {v};", "*"),
    R.MAX: (lambda ct, fp: f"-std::numeric_limits<{ct}>::infinity()" if fp
            else f"std::numeric_limits<{ct}>::lowest()",
            lambda a, v: f"{a} = std::max({a}, {v});", "max"),
    R.MIN: (lambda ct, fp: f"std::numeric_limits<{ct}>::infinity()" if fp
            else f"std::numeric_limits<{ct}>::max()",
            lambda a, v: f"{a} = std::min({a}, {v});", "min"),
    R.ANY: (lambda ct, fp: "0", lambda a, v: f"{a} = {a} | (int)({v} != 0);", "|"),
    R.ALL: (lambda ct, fp: "1", lambda a, v: f"{a} = {a} & (int)({v} != 0);", "&"),
}


class KernelWriter:
    """Writes one Kernel as C++. `stored` names the buffers other steps read (kept in memory)."""

    def __init__(self, kernel: Kernel, buffers: dict, stored: set, parallel: bool | None = None):
        """`parallel`: force the OpenMP loops on or off; None decides from the work's size."""
        self.k, self.buffers, self.stored, self.parallel = kernel, buffers, stored, parallel
        self.pvars = index_vars("p", len(kernel.prefix))
        self.ranges = dict(zip(self.pvars, kernel.prefix))
        self.locals: dict = {}
        self.counter = [0]
        self.reads: set = set()
        self.mode = self._mode()

    def _mode(self) -> str:
        rows = product(self.k.prefix)
        if any(isinstance(n.body, Reduction) for n in self.k.nodes) or not self.k.prefix:
            return "outer" if self.k.prefix else "full"
        return "outer" if (not rows.is_Integer or int(rows) >= 8) else "inner"

    def _parallel_clause(self) -> str | None:
        """The OpenMP clause of the kernel's parallel loop ("": parallel), None for serial
        loops, as its work decides (codegen/cpp/work.py). A dynamic kernel is written twice
        instead (`source`)."""
        if self.parallel is None:
            self.parallel = worth_threads(self.k)
        return "" if self.parallel else None

    def _handler(self, lines, ranges, inner=()) -> CppHandler:
        return CppHandler(self.buffers, ranges, self.locals, lines, self.counter, inner)

    # --------------------------------------------------------------------------- pointwise
    def pointwise(self, node) -> list:
        body, buf = node.body, node.buffers[0]
        k = len(self.pvars)
        xvars = index_vars("x", len(body.ranges) - k)
        sizes = body.ranges[k:]
        ranges = {**self.ranges, **dict(zip(xvars, sizes))}
        lines: list = []
        h = self._handler(lines, ranges, xvars)
        value = body.inner_fn(h, self.pvars + xvars)
        self.reads |= h_reads(h)
        lines.append(_store(buf, linear_index(self.pvars + xvars, buf.stride), value))
        par = self._parallel_clause() if self.mode == "inner" else None
        simd = "#pragma omp simd" if h.vectorizable else None
        if par is not None and xvars:
            if len(xvars) == 1:
                simd = f"#pragma omp parallel for{' simd' if h.vectorizable else ''}{par}"
            else:
                lines = _loops(xvars[1:], sizes[1:], lines, simd)
                return [f"// {buf.name} = {'+'.join(body.origins)}", *h.pre,
                        *_loops(xvars[:1], sizes[:1], lines, f"#pragma omp parallel for{par}")]
        return [f"// {buf.name} = {'+'.join(body.origins)}", *h.pre,
                *(_loops(xvars, sizes, lines, simd) if xvars else ["{", *lines, "}"])]

    # --------------------------------------------------------------------------- reductions
    def reduction(self, node) -> list:
        body = merge_reduced_dims(node.body, self.pvars, self.ranges)
        rtype = body.reduction_type
        rvars = index_vars("r", len(body.reduction_ranges))
        ranges = {**self.ranges, **dict(zip(rvars, body.reduction_ranges))}
        ct = value_type(body.dtype)
        fp = body.dtype.is_floating_point
        head = [f"// {', '.join(b.name for b in node.buffers)} = {rtype.value}"
                f"({'+'.join(body.origins)}) over {[str(s) for s in body.reduction_ranges]}"]
        if rtype == R.WELFORD:
            n = cexpr(product(body.reduction_ranges))
            s, m = self._fresh("sum"), self._fresh("m2")
            lines = head + self._accumulate(body, rvars, ranges, R.SUM, s, ct, fp)
            mean = self._fresh("mean")
            lines.append(f"{ct} {mean} = {s} / {ct}({n});")
            lines += self._accumulate(body, rvars, ranges, R.SUM, m, ct, fp,
                                      center=mean)
            results = [mean, m]
        elif rtype in ARG_REDUCTIONS:
            idx = self._fresh("idx")
            lines = head + self._argreduce(body, rvars, ranges, rtype, idx, ct)
            results = [idx]
        else:
            acc = self._fresh("acc")
            lines = head + self._accumulate(body, rvars, ranges, rtype, acc, ct, fp)
            results = [acc]
        for buf, var in zip(node.buffers, results):
            row = sympy.expand(linear_index(self.pvars, buf.stride))
            self.locals[buf.name] = (row, var)
            if buf.name in self.stored:
                lines.append(_store(buf, row, CVal(var, buf.dtype)))
        return lines

    def _fresh(self, stem: str) -> str:
        name = f"{stem}{self.counter[0]}"
        self.counter[0] += 1
        return name

    def _accumulate(self, body, rvars, ranges, rtype, acc, ct, fp, center=None) -> list:
        init, update, clause = _ACC[rtype]
        act = "int" if rtype in (R.ANY, R.ALL) else ct
        lines: list = []
        h = self._handler(lines, ranges, rvars)
        v = h.to_dtype(body.inner_fn(h, self.pvars, rvars), body.dtype)
        self.reads |= h_reads(h)
        val = v.expr
        if center is not None:
            d = self._fresh("d")
            lines.append(f"{ct} {d} = {val} - {center};")
            val = f"{d} * {d}"
        lines.append(update(acc, val))
        reds = [f"reduction({clause}:{acc})"]
        out = [f"{act} {acc} = {init(ct, fp)};", *h.pre]
        nan = None
        if rtype in (R.MAX, R.MIN) and fp:
            nan = self._fresh("nan")
            out.append(f"int {nan} = 0;")
            lines.append(f"{nan} |= ({val} != {val});")
            reds.append(f"reduction(|:{nan})")
        simd = f"#pragma omp simd {' '.join(reds)}" if h.vectorizable else None
        if self.mode == "full":
            par = self._parallel_clause()
            if par is not None:
                kind = "parallel for simd" if len(rvars) == 1 and h.vectorizable else "parallel for"
                outer = f"#pragma omp {kind} {' '.join(reds)}{par}"
                if len(rvars) == 1:
                    simd = outer
                else:
                    inner = _loops(rvars[1:], body.reduction_ranges[1:], lines, simd)
                    out += _loops(rvars[:1], body.reduction_ranges[:1], inner, outer)
                    lines = None
        if lines is not None:
            out += _loops(rvars, body.reduction_ranges, lines, simd) if rvars else lines
        if nan is not None:
            out.append(f"if ({nan}) {acc} = std::numeric_limits<{ct}>::quiet_NaN();")
        return out

    def _argreduce(self, body, rvars, ranges, rtype, idx, ct) -> list:
        lines: list = []
        h = self._handler(lines, ranges, rvars)
        v = h.to_dtype(body.inner_fn(h, self.pvars, rvars), body.dtype).expr
        self.reads |= h_reads(h)
        best = self._fresh("best")
        cmp = ">" if rtype == R.ARGMAX else "<"
        lin = cexpr(linear_index(rvars, _strides(body.reduction_ranges)))
        nan_check = f" || {v} != {v}" if body.dtype.is_floating_point else ""
        guard = f"!({best} != {best}) && " if body.dtype.is_floating_point else ""
        lines.append(f"if ({idx} < 0 || ({guard}({v} {cmp} {best}{nan_check}))) "
                     f"{{ {best} = {v}; {idx} = {lin}; }}")
        return [f"{ct} {best} = {ct}(0);", f"int64_t {idx} = -1;", *h.pre,
                *_loops(rvars, body.reduction_ranges, lines, None)]

    # -------------------------------------------------------------------- column reductions
    def column_source(self, nodes: list) -> list:
        rsizes = nodes[0].body.reduction_ranges
        rvars = index_vars("r", len(rsizes))
        last, n = self.pvars[-1], cexpr(self.k.prefix[-1])
        ranges = {**self.ranges, **dict(zip(rvars, rsizes))}
        pre, columns, stores, head = [], [], [], []
        block = [f"const int64_t xe = std::min<int64_t>(xb + {COLUMN_BLOCK}, {n});"]
        for node in nodes:
            body, buf = node.body, node.buffers[0]
            ct, fp = value_type(body.dtype), body.dtype.is_floating_point
            init, update, _ = _ACC[body.reduction_type]
            acc = self._fresh("acc")
            lines: list = []
            h = self._handler(lines, ranges, (last, *rvars))
            v = h.to_dtype(body.inner_fn(h, self.pvars, rvars), body.dtype)
            self.reads |= h_reads(h)
            slot = f"{acc}[{last} - xb]"
            lines.append(update(slot, v.expr))
            column = [f"for (int64_t {last} = xb; {last} < xe; ++{last}) {{",
                      *["    " + ln for ln in lines], "}"]
            columns += (["#pragma omp simd"] if h.vectorizable else []) + column
            block += [f"{ct} {acc}[{COLUMN_BLOCK}];",
                      f"for (int64_t i = 0; i < {COLUMN_BLOCK}; ++i) {acc}[i] = {init(ct, fp)};"]
            pre += h.pre
            store = _store(buf, linear_index(self.pvars, buf.stride), CVal(slot, buf.dtype))
            stores.append(f"for (int64_t {last} = xb; {last} < xe; ++{last}) {store}")
            head.append(f"// {buf.name} = {body.reduction_type.value}({'+'.join(body.origins)}) "
                        f"over {[str(x) for x in rsizes]}, by columns of {COLUMN_BLOCK}")
        block += pre + _loops(rvars, rsizes, columns, None) + stores
        par = self._parallel_clause()
        outer = self.pvars[:-1]
        pragma = (f"#pragma omp parallel for collapse({len(outer) + 1}){par}"
                  if par is not None else None)
        xb = [f"for (int64_t xb = 0; xb < {n}; xb += {COLUMN_BLOCK}) {{",
              *["    " + ln for ln in block], "}"]
        if not outer:
            return head + ([pragma] if pragma else []) + xb
        return head + _loops(outer, self.k.prefix[:-1], xb, None, pragma)

    # ------------------------------------------------------------------------------ kernel
    def source(self) -> tuple[str, list[str], list[str], list[str]]:
        """(C++ source, buffers read, buffers written, dim-size symbols taken as arguments).
        With a dynamic amount of work the body is written twice, parallel and serial, behind a
        test of the size: libgomp starts a team for `#pragma omp parallel if(false)` too, about
        0.5 us a call, which small calls of dynamic plans would pay in every kernel."""
        if self.parallel is not None or elements(self.k).is_Integer:
            return self._wrap(self._body())
        self.parallel = True
        serial = KernelWriter(self.k, self.buffers, self.stored, parallel=False)
        lines = [f"if {threads_condition(self.k, cexpr)} {{",
                 *["    " + ln for ln in self._body()], "} else {",
                 *["    " + ln for ln in serial._body()], "}"]
        self.reads |= serial.reads
        return self._wrap(lines)

    def _body(self) -> list[str]:
        """The statements of the kernel function: every node, in its row loops."""
        columns = column_nodes(self.k.nodes, self.pvars, self.ranges, self.stored)
        if columns is not None:
            return self.column_source(columns)   # it holds its own loops over the rows
        body: list = []
        for node in self.k.nodes:
            body += (self.reduction(node) if isinstance(node.body, Reduction)
                     else self.pointwise(node))
        if self.mode == "outer" and self.pvars:
            par = self._parallel_clause()
            pragma = (f"#pragma omp parallel for collapse({len(self.pvars)}){par}"
                      if par is not None else None)
            return _loops(self.pvars, self.k.prefix, body, None, pragma)
        if self.pvars:   # "inner" mode: serial row loops around parallel inner loops
            return _loops(self.pvars, self.k.prefix, body, None)
        return body

    def _wrap(self, body: list) -> tuple[str, list[str], list[str], list[str]]:
        """The function around the statements `body`."""
        written = [b.name for b in self.k.writes]
        outs = [n for n in written if n in self.stored]
        ins = first_use_order(self.reads - set(written), "\n".join(body))   # codegen/shapes.py
        params = [f"const {STORAGE[self.buffers[n].dtype]}* __restrict__ {n}" for n in ins]
        params += [f"{STORAGE[self.buffers[n].dtype]}* __restrict__ {n}" for n in outs]
        room = room_check([self.buffers[n] for n in (*ins, *outs)])
        params += [ROOM_PARAM] if room else []
        text = "\n".join(body + room) + " ".join(cexpr(p) for p in self.k.prefix)
        sizes = size_names(text)
        params += [f"int64_t s_{n}" for n in sizes]
        lines = [f"// {self.k.name}: " + "; ".join(self.k.reasons),
                 f'extern "C" int {self.k.name}({", ".join(params)}) {{',
                 *["    " + ln for ln in room],
                 "    int aotc_err = 0;", *["    " + ln for ln in body],
                 "    return aotc_err;", "}"]
        return "\n".join(lines) + "\n", ins, outs, sizes


def _strides(sizes):
    from aotc.codegen.ir import contiguous_strides
    return contiguous_strides(sizes)


def h_reads(h: CppHandler) -> set:
    return h.read_names


def kernel_source(kernel: Kernel, buffers: dict, stored: set):
    if hasattr(kernel, "cpp_source"):   # written by hand (codegen/cpp/quant_mm.py)
        return kernel.cpp_source()
    return KernelWriter(kernel, buffers, stored).source()
