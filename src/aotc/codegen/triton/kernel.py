"""Triton kernel emission: one fused Kernel in, one `@triton.jit` function out.

The Triton twin of `codegen/cpp/kernel.py`. The loop IR bodies run with `TritonHandler`, which
prints each op as a Triton statement on blocks. Program ids run over the kernel's flattened row
prefix, XBLOCK rows per program (`xindex`, a [XBLOCK, 1] block); each node then runs over its
inner elements (pointwise: the rest of its dims; reduction: its reduction dims) as one block of
`tl.arange` per node (`rindex<j>`, a [1, R<j>_BLOCK] block), masked at ragged edges:

  * reductions are persistent (one block per row) up to MAX_PERSISTENT elements and loop over
    blocks beyond; results stay in registers ([XBLOCK, 1]) for the rest of the kernel, stored
    only when another step reads them (`stored`), as in the C++ backend;
  * an outer reduction (a column sum: rows contiguous in memory) takes a wide XBLOCK and
    loops over small R blocks (blocks.py); the tile is the same [XBLOCK, R] one, and Triton's
    coalescing, reading the index, makes X its contiguous (vectorized) axis;
  * a pointwise-only kernel with no node reading another's output splits its inner elements
    over a second grid axis; otherwise a program loops over them;
  * a node that reads what an earlier node of the same kernel stored is preceded by a block
    barrier (rows never cross programs, so that is all the ordering needed);
  * a load whose address is not provably inside its buffer (the arm of a select that a lane
    drops, as `cat` computes for the parts a lane is not in) is masked to the buffer: no lane
    ever dereferences an address outside its tensors.

Every value carries the block axes it varies over ({"x", "r"}), so loads and stores are masked
and broadcast by exactly the axes their index uses.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import sympy
import torch

from aotc.codegen.lowering.row_statistics import statistics_first
from aotc.codegen.ir import (ARG_REDUCTIONS, PREDICATES, Op, Reduction, ReductionType as R,
                             index_vars, linear_index, product)
from aotc.codegen.scheduler import Kernel
from aotc.codegen.shapes import first_use_order, size_names
from aotc.codegen.triton.blocks import (BlockConfig, KernelBlocks, NodeBlock, SizeHints,
                                        plan_blocks)
from aotc.codegen.triton.build import PDL_PARAM, KernelSource, pdl_body
from aotc.codegen.triton.printer import (HALF, POINTER, TL, cast, constant, convert, extent,
                                         fold_index, in_bounds, op_expr, reduce_sum,
                                         stored_value, texpr, to_half, unravel, value_dtype,
                                         value_type)

X, XR = frozenset("x"), frozenset("xr")


@dataclass(frozen=True, slots=True)
class TVal:
    expr: str
    dtype: torch.dtype          # IR dtype; the value is held in value_dtype(dtype)
    axes: frozenset             # block axes the value varies over: subset of {"x", "r"}
    const: object = None        # the Python value of a constant (folded at codegen time)


@dataclass
class Scope:
    """Where a node's body runs: its block (R block name, masks) and its loop variables."""
    block: NodeBlock
    xmask: str | None
    axes: dict = field(default_factory=dict)      # sympy var -> frozenset of axes

    def shape(self, axes) -> str:
        return {frozenset(): "[1, 1]", X: "[XBLOCK, 1]", frozenset("r"): f"[1, {self.block.rb}]",
                XR: f"[XBLOCK, {self.block.rb}]"}[frozenset(axes)]


class TritonHandler:
    """Ops handler that prints Triton statements into `lines`."""

    def __init__(self, writer: "KernelWriter", scope: Scope, ranges: dict, lines: list):
        self.w, self.scope, self.ranges, self.lines = writer, scope, ranges, lines
        self.cse: dict[str, TVal] = {}
        self.masks: list[TVal] = []          # conditions of the enclosing `masked` regions
        self.read_names: set[str] = set()
        self.index_ranges = dict(ranges)       # plus runtime indices, for bounds proofs only

    # ------------------------------------------------------------------------------ helpers
    def _var(self, expr: str, dtype, axes) -> TVal:
        if expr in self.cse:
            return self.cse[expr]
        name = f"tmp{self.w.fresh()}"
        self.lines.append(f"{name} = {expr}")
        val = TVal(name, dtype, frozenset(axes))
        self.cse[expr] = val
        return val

    def axes_of(self, expr) -> frozenset:
        out = frozenset()
        for s in sympy.sympify(expr).free_symbols:
            out |= self.scope.axes.get(s, frozenset())
        return out

    def mask_for(self, axes) -> tuple[str | None, frozenset]:
        """The mask of the lanes a value over `axes` is valid in (block edges and enclosing
        `masked` conditions), and the axes that mask varies over."""
        parts, all_axes = [], frozenset(axes)
        if "x" in axes and self.scope.xmask:
            parts.append(self.scope.xmask)
        if "r" in axes and self.scope.block.rmask:
            parts.append(self.scope.block.rmask)
        for m in self.masks:
            parts.append(m.expr)
            all_axes |= m.axes
        if "x" in all_axes - frozenset(axes) and self.scope.xmask:
            parts.append(self.scope.xmask)
        if "r" in all_axes - frozenset(axes) and self.scope.block.rmask:
            parts.append(self.scope.block.rmask)
        if not parts:
            return None, all_axes
        if len(parts) == 1:
            return parts[0], all_axes
        return self._var(" & ".join(dict.fromkeys(parts)), torch.bool, all_axes).expr, all_axes

    def pointer(self, name: str, index, axes, offset: str | None = None) -> str:
        """Pointers into `name` at `index` (printed as `offset`) as a block over `axes`; one over
        no axis is a [1, 1] block: the interpreter mis-broadcasts scalar predicates to floats."""
        self.w.address_sizes |= {v.name for v in sympy.sympify(index).free_symbols if v.is_positive}
        text = f"{name} + {offset or texpr(index)}"
        if not axes or self.axes_of(index) != frozenset(axes):
            text = f"tl.broadcast_to({text}, {self.scope.shape(axes)})"
        return text

    # ------------------------------------------------------------------------------ the ops
    def load(self, name: str, index) -> TVal:
        index = fold_index(index, self.ranges)
        buf = self.w.buffers[name]
        local = self.w.locals.get(name)
        if local is not None and sympy.expand(index - local[0]) == 0:
            return local[1]
        self.read_names.add(name)
        mask, axes = self.mask_for(self.axes_of(index))
        offset = None
        if not in_bounds(index, buf, self.index_ranges):
            mask, offset = self._bounds_mask(index, buf, mask, axes)
        ptr = self.pointer(name, index, axes, offset)
        other = "0.0" if buf.dtype.is_floating_point else "0"
        text = f"tl.load({ptr}, {mask}, other={other})" if mask else f"tl.load({ptr})"
        if buf.dtype in HALF:
            text += ".to(tl.float32)"
        return self._var(text, buf.dtype, axes)

    def _bounds_mask(self, index, buf, mask: str | None, axes) -> tuple[str, str]:
        """(`mask` narrowed to the lanes whose address lies inside `buf`, the index's variable):
        bodies may compute an address they do not use (the arm a select drops, as `cat` does
        for the parts a lane is not in), never dereferenced. A scalar index is a [1, 1] block."""
        i = self._var(texpr(index) if self.axes_of(index) else f"tl.full({self.scope.shape(axes)}, "
                      f"0, tl.int64) + ({texpr(index)})", torch.int64, self.axes_of(index)).expr
        inside = f"({i} >= 0) & ({i} < {texpr(extent(buf))})"
        return self._var(f"{mask} & {inside}" if mask else inside, torch.bool, axes).expr, i

    def constant(self, value, dtype) -> TVal:
        return TVal(constant(value, dtype), dtype, frozenset(), const=value)

    def index_expr(self, expr, dtype) -> TVal:
        e = fold_index(sympy.sympify(expr), self.ranges)
        if e.is_Integer:
            return self.constant(int(e), dtype)
        return self._var(f"{cast(texpr(e), self.axes_of(e), value_type(dtype))}", dtype,
                         self.axes_of(e))

    def to_dtype(self, x: TVal, dtype) -> TVal:
        if x.dtype == dtype:
            return x
        if x.const is not None:
            return self.constant(convert(x.const, dtype), dtype)
        if dtype == torch.bool:
            return self._var(f"({x.expr} != 0)", dtype, x.axes)
        if dtype in HALF:   # round to the half type, keep computing in fp32
            return self._var(to_half(x.expr, x.axes, x.dtype, dtype), dtype, x.axes)
        if value_dtype(x.dtype) == value_dtype(dtype):
            return TVal(x.expr, dtype, x.axes)
        return self._var(cast(x.expr, x.axes, TL[dtype]), dtype, x.axes)

    def op(self, op, *args) -> TVal:
        args = [a if isinstance(a, TVal) else self.constant(a, torch.float32) for a in args]
        if all(a.const is not None for a in args):   # Triton's math wants one tensor operand
            a = args[0]
            args[0] = self._var(f"tl.full([1, 1], {a.expr}, {value_type(a.dtype)})", a.dtype, ())
        dtype = torch.bool if op in PREDICATES else args[-1].dtype
        src = args[0].dtype if op in PREDICATES else dtype
        axes = frozenset().union(*(a.axes for a in args))
        if op == Op.POW and args[1].const in (2, 3):   # x**2, x**3: multiply
            return self._var("(" + " * ".join([args[0].expr] * int(args[1].const)) + ")",
                             dtype, axes)
        text = op_expr(op, [a.expr for a in args], [a.dtype for a in args], value_dtype(src))
        return self._var(text, dtype, axes)

    def masked(self, mask: TVal, fn, other, dtype) -> TVal:
        other = other if isinstance(other, TVal) else self.constant(other, dtype)
        self.masks.append(mask)
        outer, self.cse = self.cse, dict(self.cse)
        value = self.to_dtype(fn(), dtype)
        self.cse = outer
        self.masks.pop()
        return self._var(f"tl.where({mask.expr}, {value.expr}, {other.expr})", dtype,
                         mask.axes | value.axes | other.axes)

    def bounded_index(self, expr, size):
        return expr   # index ranges here come from the block's masks

    def indirect(self, value: TVal, size, wraps=True, op="aten::index.Tensor"):
        """A runtime index: wrapped if negative where `wraps`, checked against `size`; an index
        out of range stores this kernel's error code into `aotc_err` and reads element 0
        instead (a negative index is out of range where it does not wrap, as in eager)."""
        self.w.uses_err = True
        n = texpr(sympy.sympify(size))
        k = self.w.fresh()
        name, bad = f"i{k}", f"bad{k}"
        mask, axes = self.mask_for(value.axes)
        active = f" & {mask}" if mask else ""
        self.lines += [f"{name} = {value.expr}",
                       *([f"{name} = tl.where({name} < 0, {name} + {n}, {name})"] if wraps
                         else []),
                       f"{bad} = (({name} < 0) | ({name} >= {n})){active}",
                       f"tl.store({self.pointer('aotc_err', 0, axes)}, {self.w.error_code}, {bad})",
                       f"{name} = tl.where({bad}, 0, {name})"
                       + ("" if self.w.wide else ".to(tl.int32)")]
        symbol = sympy.Symbol(name, integer=True)
        self.scope.axes[symbol] = axes
        self.index_ranges[symbol] = sympy.sympify(size)   # clamped to [0, size) above
        return symbol


_ACC = {  # reduction -> (init(dtype), elementwise update(acc, v), final reduce(acc))
    R.SUM: (lambda d: 0, lambda a, v: f"{a} + {v}", reduce_sum),
    R.PROD: (lambda d: 1, lambda a, v: f"{a} * {v}",
             lambda a: f"tl.reduce({a}, 1, aotc_mul, keep_dims=True)"),
    R.MAX: (lambda d: float("-inf") if d.is_floating_point else torch.iinfo(d).min,
            lambda a, v: f"aotc_maximum({a}, {v})",
            lambda a: f"tl.reduce({a}, 1, aotc_maximum, keep_dims=True)"),
    R.MIN: (lambda d: float("inf") if d.is_floating_point else torch.iinfo(d).max,
            lambda a, v: f"aotc_minimum({a}, {v})",
            lambda a: f"tl.reduce({a}, 1, aotc_minimum, keep_dims=True)"),
    R.ANY: (lambda d: 0, lambda a, v: f"tl.maximum({a}, {v})",
            lambda a: f"(tl.reduce({a}, 1, aotc_maximum, keep_dims=True) != 0)"),
    R.ALL: (lambda d: 1, lambda a, v: f"tl.minimum({a}, {v})",
            lambda a: f"(tl.reduce({a}, 1, aotc_minimum, keep_dims=True) != 0)"),
}


class KernelWriter:
    """Writes one Kernel as a Triton function. `stored` names the buffers other steps read;
    `config` overrides the block heuristics (autotuning); `hints` (blocks.SizeHints) size dynamic
    dims' blocks and bound their index arithmetic."""

    def __init__(self, kernel: Kernel, buffers: dict, stored: set, error_code: int = 1,
                 config: BlockConfig | None = None, hints: SizeHints | None = None):
        self.k, self.buffers, self.stored, self.error_code = kernel, buffers, stored, error_code
        self.pvars = index_vars("p", len(kernel.prefix))
        self.ranges = dict(zip(self.pvars, kernel.prefix))
        self.locals: dict = {}              # reduction results kept in registers
        self.counter = 0
        self.reads: set = set()
        self.address_sizes: set = set()     # size symbols that enter load and store addresses
        self.written: set = set()
        self.uses_err = False
        self.barrier = False
        self.blocks: KernelBlocks = plan_blocks(kernel, buffers, config, hints)
        self.wide = self.blocks.wide

    def fresh(self) -> int:
        self.counter += 1
        return self.counter - 1

    def _scope(self, j: int, vars_) -> Scope:
        axes = {p: X for p in self.pvars}
        axes.update({v: frozenset("r") for v in vars_})
        return Scope(self.blocks.nodes[j], "xmask" if self.blocks.xmask else None, axes)

    def _chunk(self, j: int, names: list, sizes) -> tuple[list, list]:
        """(head, body) of node j's R block: `head` opens its loop or places its chunk (split
        over grid axis 1), `body` computes the block's index, mask and per-dim variables."""
        b = self.blocks.nodes[j]
        ar = f"tl.arange(0, {b.rb})[None, :]"
        if b.mode == "split":
            start = "tl.program_id(1)" + (".to(tl.int64)" if self.wide else "")
            head, base = [f"roff{j} = {start} * {b.rb}"], f"roff{j} + {ar}"
        elif b.mode == "loop":
            head, base = [f"for roff{j} in range(0, {texpr(b.numel)}, {b.rb}):"], f"roff{j} + {ar}"
        else:
            head, base = [], ar
        body = [f"rindex{j} = {base}"]
        if b.rmask:
            body.append(f"{b.rmask} = rindex{j} < {texpr(b.numel)}")
        return head, body + unravel(f"rindex{j}", names, sizes)

    def _nest(self, head: list, body: list) -> list:
        pad = "    " if head and head[-1].endswith(":") else ""
        return head + [pad + ln for ln in body]

    def _note_reads(self, h: TritonHandler) -> None:
        """Record what a node read. A read of this kernel's own earlier stores needs a block
        barrier first (other threads of the program wrote them)."""
        self.reads |= h.read_names
        self.barrier |= bool(h.read_names & self.written)

    def _node(self, j: int, node) -> list:
        self.barrier = False
        lines = (self.reduction(j, node) if isinstance(node.body, Reduction)
                 else self.pointwise(j, node))
        return (["tl.debug_barrier()"] if self.barrier else []) + lines

    def _store(self, h: TritonHandler, buf, index, value: TVal, axes) -> str:
        mask, _ = h.mask_for(axes)
        v = stored_value(value, buf.dtype)
        self.written.add(buf.name)
        return f"tl.store({h.pointer(buf.name, index, axes)}, {v}{', ' + mask if mask else ''})"

    # --------------------------------------------------------------------------- pointwise
    def pointwise(self, j: int, node) -> list:
        body, buf = node.body, node.buffers[0]
        k = len(self.pvars)
        sizes = body.ranges[k:]
        xvars = index_vars(f"x{j}_", len(sizes))
        ranges = {**self.ranges, **dict(zip(xvars, sizes))}
        scope = self._scope(j, xvars)
        head, lines = self._chunk(j, [v.name for v in xvars], sizes) if sizes else ([], [])
        h = TritonHandler(self, scope, ranges, lines)
        value = body.inner_fn(h, self.pvars + xvars)
        index = fold_index(linear_index(self.pvars + xvars, buf.stride), ranges)
        self._note_reads(h)
        lines.append(self._store(h, buf, index, value, XR if sizes else X))
        return [f"# {buf.name} = {'+'.join(body.origins)}", *self._nest(head, lines)]

    # --------------------------------------------------------------------------- reductions
    def reduction(self, j: int, node) -> list:
        body = node.body
        rtype = body.reduction_type
        rvars = index_vars(f"r{j}_", len(body.reduction_ranges))
        ranges = {**self.ranges, **dict(zip(rvars, body.reduction_ranges))}
        head = [f"# {', '.join(b.name for b in node.buffers)} = {rtype.value}"
                f"({'+'.join(body.origins)}) over {[str(s) for s in body.reduction_ranges]}"]
        emit = lambda: self._body(j, body, rvars, ranges)
        if rtype == R.WELFORD:
            lines, results = self._welford(j, body, emit)
        elif rtype in ARG_REDUCTIONS:
            lines, results = self._argreduce(j, body, emit)
        else:
            lines, results = self._accumulate(j, body, emit)
        lines = head + lines
        for buf, var in zip(node.buffers, results):
            row = fold_index(linear_index(self.pvars, buf.stride), self.ranges)
            val = TVal(var, buf.dtype, X)
            self.locals[buf.name] = (row, val)
            if buf.name in self.stored:
                h = TritonHandler(self, self._scope(j, ()), self.ranges, lines)
                lines.append(self._store(h, buf, row, val, X))
        return lines

    def _body(self, j, body, rvars, ranges) -> tuple[list, list, TVal, str | None]:
        """(loop head, body lines, value as a full [XBLOCK, R] block, rmask) of node j."""
        head, lines = self._chunk(j, [v.name for v in rvars], body.reduction_ranges)
        h = TritonHandler(self, self._scope(j, rvars), ranges, lines)
        v = h.to_dtype(body.inner_fn(h, self.pvars, rvars), body.dtype)
        if v.axes != XR:   # a value that does not vary over the whole block: fill one
            shape = f"[XBLOCK, {self.blocks.nodes[j].rb}]"
            v = h._var(f"tl.full({shape}, {v.expr}, {value_type(v.dtype)})" if v.const is not None
                       else f"tl.broadcast_to({v.expr}, {shape})", v.dtype, XR)
        self._note_reads(h)
        return head, lines, v, self.blocks.nodes[j].rmask

    def _accumulate(self, j, body, emit) -> tuple[list, list]:
        init, update, final = _ACC[body.reduction_type]
        flag = body.reduction_type in (R.ANY, R.ALL)
        dt = torch.int32 if flag else value_dtype(body.dtype)
        fill = constant(init(dt), dt)
        head, lines, v, rmask = emit()
        val = v.expr if not flag else f"({v.expr} != 0).to(tl.int32)"
        res = f"red{self.fresh()}"
        if head:   # looped: an elementwise accumulator block, reduced after the loop
            acc = f"acc{self.fresh()}"
            upd = update(acc, val)
            lines.append(f"{acc} = tl.where({rmask}, {upd}, {acc})" if rmask else f"{acc} = {upd}")
            return ([f"{acc} = tl.full([XBLOCK, {self.blocks.nodes[j].rb}], {fill}, {TL[dt]})",
                     *self._nest(head, lines), f"{res} = {final(acc)}"], [res])
        if rmask:
            val = f"tl.where({rmask}, {val}, {fill})"
        return lines + [f"{res} = {final(val)}"], [res]

    def _welford(self, j, body, emit) -> tuple[list, list]:
        """Mean and centered sum of squares in two passes over the row (as the C++ backend)."""
        n = texpr(product(body.reduction_ranges))
        dt = TL[value_dtype(body.dtype)]
        mean, m2 = f"mean{self.fresh()}", f"m2_{self.fresh()}"
        head, lines, v, rmask = emit()
        where = (lambda e: f"tl.where({rmask}, {e}, 0.0)") if rmask else (lambda e: e)
        if not head:
            d = f"d{self.fresh()}"
            return lines + [f"{mean} = {reduce_sum(where(v.expr))} / {n}",
                            f"{d} = {where(f'{v.expr} - {mean}')}",
                            f"{m2} = {reduce_sum(f'{d} * {d}')}"], [mean, m2]
        rb = self.blocks.nodes[j].rb
        s, q = f"acc{self.fresh()}", f"acc{self.fresh()}"
        out = [f"{s} = tl.full([XBLOCK, {rb}], 0, {dt})", *self._nest(head, lines + [
            f"{s} = {s} + {where(v.expr)}"]), f"{mean} = {reduce_sum(s)} / {n}"]
        head, lines, v, rmask = emit()
        d = f"d{self.fresh()}"
        out += [f"{q} = tl.full([XBLOCK, {rb}], 0, {dt})", *self._nest(head, lines + [
            f"{d} = {where(f'{v.expr} - {mean}')}", f"{q} = {q} + {d} * {d}"]),
                f"{m2} = {reduce_sum(q)}"]
        return out, [mean, m2]

    def _argreduce(self, j, body, emit) -> tuple[list, list]:
        rtype = body.reduction_type
        combine = "aotc_argmax" if rtype == R.ARGMAX else "aotc_argmin"
        dt = value_dtype(body.dtype)
        fill = constant((_ACC[R.MAX] if rtype == R.ARGMAX else _ACC[R.MIN])[0](dt), dt)
        rb, idt = self.blocks.nodes[j].rb, "tl.int64" if self.wide else "tl.int32"
        head, lines, v, rmask = emit()
        idx, res = f"idx{self.fresh()}", f"arg{self.fresh()}"
        val = f"tl.where({rmask}, {v.expr}, {fill})" if rmask else v.expr
        lines.append(f"{idx} = tl.broadcast_to(rindex{j}, [XBLOCK, {rb}]).to({idt})")
        final = lambda vals, ids: (f"_, {res} = tl.reduce(({vals}, {ids}), 1, {combine}, "
                                   f"keep_dims=True)")
        if not head:
            return lines + [final(val, idx), f"{res} = {res}.to(tl.int64)"], [res]
        av, ai = f"accv{self.fresh()}", f"acci{self.fresh()}"
        nv, ni = f"nv{self.fresh()}", f"ni{self.fresh()}"
        lines += [f"{nv}, {ni} = {combine}({av}, {ai}, {val}, {idx})",
                  f"{av} = tl.where({rmask}, {nv}, {av})" if rmask else f"{av} = {nv}",
                  f"{ai} = tl.where({rmask}, {ni}, {ai})" if rmask else f"{ai} = {ni}"]
        return ([f"{av} = tl.full([XBLOCK, {rb}], {fill}, {TL[dt]})",
                 f"{ai} = tl.full([XBLOCK, {rb}], {2**31 - 1}, {idt})", *self._nest(head, lines),
                 final(av, ai), f"{res} = {res}.to(tl.int64)"], [res])

    # ------------------------------------------------------------------------------ kernel
    def _nodes(self) -> list:
        return [ln for j, node in enumerate(self.k.nodes) for ln in self._node(j, node)]

    def _fast_path(self) -> tuple[str, list] | None:
        """(condition, body) for calls whose dynamic sizes fit the blocks: one block per loop,
        each element loaded once (the loops reload the row every pass: a dynamic softmax ran
        4x slower). None without dynamic loops. Temporaries are numbered apart from the
        loops' (Triton wants one type per name set in both branches of an `if`)."""
        looped = {j: b for j, b in enumerate(self.blocks.nodes)
                  if b.mode == "loop" and not sympy.sympify(b.numel).is_Integer}
        if not looped:
            return None
        twin = KernelWriter.__new__(KernelWriter)
        twin.__dict__.update(self.__dict__, locals={}, reads=set(), written=set(),
                             address_sizes=set(),
                             uses_err=False, barrier=False, counter=self.counter)
        nodes = [dataclasses.replace(b, mode="single") if j in looped else b
                 for j, b in enumerate(self.blocks.nodes)]
        twin.blocks = dataclasses.replace(self.blocks, nodes=nodes)
        lines = twin._nodes()
        self.reads |= twin.reads
        self.address_sizes |= twin.address_sizes
        self.uses_err |= twin.uses_err
        conds = dict.fromkeys(f"({texpr(b.numel)} <= {b.rb})" for b in looped.values())
        return " & ".join(conds), lines

    def _rows(self) -> list:
        """Lines that place a program's XBLOCK rows and split them into the row variables."""
        pid = "tl.program_id(0)" + (".to(tl.int64)" if self.wide else "")
        lines = [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]"]
        if self.blocks.xmask:
            lines.append(f"xmask = xindex < {texpr(self.blocks.rows)}")
        return lines + unravel("xindex", [p.name for p in self.pvars], self.k.prefix)

    def source(self) -> "KernelSource":
        body, fast = self._nodes(), self._fast_path()
        if fast is not None:
            body = [f"if {fast[0]}:", *("    " + ln for ln in fast[1]), "else:",
                    *("    " + ln for ln in body)]
        written = [b.name for b in self.k.writes]
        outs = [n for n in written if n in self.stored]
        ins = first_use_order(self.reads - set(written), "\n".join(body))   # codegen/shapes.py
        text = "\n".join(body + self._rows()) + " ".join(
            texpr(n.numel) for n in self.blocks.nodes)
        sizes = size_names(text)
        signature = {n: POINTER[self.buffers[n].dtype] for n in ins + outs}
        if self.uses_err:
            signature["aotc_err"] = "*i32"
        # sizes in the width of the index arithmetic: an i64 size would widen every index
        # expression it enters (and 64-bit division by a runtime size is slow)
        signature.update({f"s_{n}": "i64" if self.wide else "i32" for n in sizes})
        constexprs = {"XBLOCK": self.blocks.xblock}
        constexprs.update({b.rb: b.size for b in self.blocks.nodes if b.rb})
        params = ", ".join([*signature, *(f"{c}: tl.constexpr" for c in constexprs), PDL_PARAM])
        lines = ["@triton.jit", f"def {self.k.name}({params}):",
                 *(f"    # {r}" for r in self.k.reasons)]
        grid = self.blocks.grid()
        lines += ["    " + ln for ln in pdl_body([*self._rows(), *body], self.buffers, grid,
                                                  statistics_first(self.k.nodes[0]))]
        return KernelSource(name=self.k.name, text="\n".join(lines) + "\n", ins=ins, outs=outs,
                            sizes=sizes, signature=signature, constexprs=constexprs,
                            grid=grid, num_warps=self.blocks.num_warps,
                            error_code=self.error_code if self.uses_err else None,
                            aligned=tuple(f"s_{n}" for n in sizes if n in self.address_sizes))


def kernel_source(kernel: Kernel, buffers: dict, stored: set, error_code: int = 1,
                  config: BlockConfig | None = None, hints: SizeHints | None = None):
    return KernelWriter(kernel, buffers, stored, error_code, config, hints).source()

