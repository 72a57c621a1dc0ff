"""The forms of a Triton reduction node: accumulated (sum, prod, max, min, any, all), Welford
(mean and m2 in two passes over the row), arg (argmax, argmin), each persistent (one block) or
looped. A mixin of codegen/triton/kernel.py's KernelWriter: each form takes `emit`, which prints
the node's body for one block, and returns (lines, result names, the axes the results vary
over: {"x"}, or none where the reduced value is the same for every row)."""
from __future__ import annotations

import torch

from aotc.codegen.ir import ReductionType as R, product
from aotc.codegen.triton.printer import TL, constant, reduce_sum, texpr, value_dtype

X = frozenset("x")

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


class ReductionForms:
    def _accumulate(self, j, body, emit) -> tuple[list, list, frozenset]:
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
            return ([f"{acc} = tl.full({self._tile(j, v.axes)}, {fill}, {TL[dt]})",
                     *self._nest(head, lines), f"{res} = {final(acc)}"], [res], v.axes & X)
        if rmask:
            val = f"tl.where({rmask}, {val}, {fill})"
        return lines + [f"{res} = {final(val)}"], [res], v.axes & X

    def _welford(self, j, body, emit) -> tuple[list, list, frozenset]:
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
                            f"{m2} = {reduce_sum(f'{d} * {d}')}"], [mean, m2], v.axes & X
        tile = self._tile(j, v.axes)
        s, q = f"acc{self.fresh()}", f"acc{self.fresh()}"
        out = [f"{s} = tl.full({tile}, 0, {dt})", *self._nest(head, lines + [
            f"{s} = {s} + {where(v.expr)}"]), f"{mean} = {reduce_sum(s)} / {n}"]
        head, lines, v, rmask = emit()
        d = f"d{self.fresh()}"
        out += [f"{q} = tl.full({tile}, 0, {dt})", *self._nest(head, lines + [
            f"{d} = {where(f'{v.expr} - {mean}')}", f"{q} = {q} + {d} * {d}"]),
                f"{m2} = {reduce_sum(q)}"]
        return out, [mean, m2], v.axes & X

    def _argreduce(self, j, body, emit) -> tuple[list, list, frozenset]:
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
            return lines + [final(val, idx), f"{res} = {res}.to(tl.int64)"], [res], X
        av, ai = f"accv{self.fresh()}", f"acci{self.fresh()}"
        nv, ni = f"nv{self.fresh()}", f"ni{self.fresh()}"
        lines += [f"{nv}, {ni} = {combine}({av}, {ai}, {val}, {idx})",
                  f"{av} = tl.where({rmask}, {nv}, {av})" if rmask else f"{av} = {nv}",
                  f"{ai} = tl.where({rmask}, {ni}, {ai})" if rmask else f"{ai} = {ni}"]
        return ([f"{av} = tl.full([XBLOCK, {rb}], {fill}, {TL[dt]})",
                 f"{ai} = tl.full([XBLOCK, {rb}], {2**31 - 1}, {idt})", *self._nest(head, lines),
                 final(av, ai), f"{res} = {res}.to(tl.int64)"], [res], X)

