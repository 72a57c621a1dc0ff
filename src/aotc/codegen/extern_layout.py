"""Layouts of extern and view steps: what strides an ATen call really returns, given the
strides its arguments really have.

A graph value's slot starts with the strides eager produced at export, where every activation
was contiguous. Codegen changes some layouts (channels-last convolution outputs and the kernels
that follow them), and ATen ops propagate the layout of their inputs: an adaptive average pool
over a channels-last tensor answers channels-last, and a `view` of it fails ("view size is not
compatible with input tensor's size and stride"). So each extern and view step over an
argument laid out otherwise than at export (non-contiguous, or contiguous where eager's value
was not: a kernel output stored contiguously, whose views eager took of a permuted tensor) is
run once on meta tensors with the arguments' planned strides, and its output slots take the
strides it returns; kernels then read the tensor as it is, and a `view` of such a base becomes
a `reshape` (a view where the strides allow one).

ATen's compute kernels take contiguous or channels-last (dense, 4-d) inputs; some (group norm,
several pooling and upsampling kernels) check that their input is one of the two, so any other
layout (a permuted view of a channels-last tensor, say) is copied into a contiguous buffer
before such a call (`standard_layout`) -- unless the argument has exactly the strides eager gave
it at export, which the op took then (a transposed weight fed to `mm`, say: copying it would
add a full pass over the weight to every call).
"""
from __future__ import annotations

import sympy
import torch

from aotc.codegen.ir import contiguous_strides, dims, size_texts, sym
from aotc.artifact.dtypes import DTYPES, LAYOUTS, MEMORY_FORMATS
from aotc.artifact.encoding import SlotKind, StepKind

VIEW = "aten::view.default"
RESHAPE = "aten::reshape.default"


def channels_last_strides(shape) -> tuple:
    n, c, h, w = shape
    return (h * w * c, sympy.Integer(1), w * c, c)


def same_strides(shape, a, b) -> bool:
    """Equal strides, ignoring those of size-1 dims (as torch does)."""
    return all(sym(d) == 1 or sympy.simplify(sym(x) - sym(y)) == 0
               for d, x, y in zip(shape, a, b))


def standard_layout(slot) -> bool:
    """Whether an ATen kernel takes the slot's tensor as it is: contiguous, or channels-last
    dense in 4 dims."""
    shape, stride = dims(slot.shape), dims(slot.stride)
    if same_strides(shape, stride, contiguous_strides(shape)):
        return True
    return len(shape) == 4 and same_strides(shape, stride, channels_last_strides(shape))


def _static(slot) -> bool:
    return all(d.is_Integer for d in dims(slot.shape) + dims(slot.stride))


def meta_strides(op, args: list, kwargs: dict, slots) -> list | None:
    """The strides of each tensor output of `op` called on meta tensors laid out as the
    argument slots (a PlanBuilder) say, or None where that cannot be found (symbolic sizes,
    an op with no meta kernel): the caller keeps the strides it had."""
    tensors = [slots.slot(a["slot"])
               for a in _slot_args(args) + _slot_args(list(kwargs.values()))]
    if not all(s.is_tensor and _static(s) for s in tensors):
        return None
    try:
        out = op(*[_meta(a, slots) for a in args],
                 **{k: _meta(v, slots) for k, v in kwargs.items()})
    except Exception:   # noqa: BLE001 - no meta kernel, or one stricter than ATen's: keep
        return None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [tuple(t.stride()) if isinstance(t, torch.Tensor) else None for t in outs]


def declare(plan, sid: int, stride) -> None:
    """Set slot `sid`'s strides to what the step really returns."""
    shape = dims(plan.slot(sid).shape)
    plan.update(sid, stride=size_texts(tuple(sym(s) for s in stride)),
                contiguous=same_strides(shape, stride, contiguous_strides(shape)))


def _slot_args(args: list) -> list:
    out = []
    for a in args:
        if isinstance(a, list):
            out += _slot_args(a)
        elif isinstance(a, dict) and "slot" in a:
            out.append(a)
    return out


def _meta(a, slots: list):
    if isinstance(a, list):
        return [_meta(x, slots) for x in a]
    if not isinstance(a, dict):
        return a
    (tag, payload), = a.items()
    if tag == "slot":
        s = slots.slot(payload)
        return torch.empty_strided([int(d) for d in dims(s.shape)],
                                   [int(d) for d in dims(s.stride)],
                                   dtype=DTYPES[s.dtype], device="meta")
    decoded = {"sym": lambda p: int(sym(p)), "float": float, "dtype": DTYPES.__getitem__,
               "device": lambda p: torch.device("meta"), "layout": LAYOUTS.__getitem__,
               "memory_format": MEMORY_FORMATS.__getitem__}
    return decoded[tag](payload)


def lay_out_extern(lowering, view: bool, name: str, args: list, kwargs: dict, out: list):
    """An extern (or, with `view`, a view) call of op `name` on `args` and `kwargs` (Program-
    encoded) over planned layouts: arguments an ATen kernel cannot take as they are copied
    contiguous first, `view` of a base it cannot view becomes `reshape`, and the output slots
    `out` take the strides the call returns (found on meta tensors). Returns the call to make,
    (name, args, kwargs)."""
    from aotc.codegen.plan import torch_op
    plan = lowering.plan
    tensor_args = _slot_args(args) + _slot_args(list(kwargs.values()))
    if all(_as_eager(lowering, a["slot"]) or _contiguous_value(lowering, a["slot"])
           for a in tensor_args):
        return name, args, kwargs   # laid out as at export: the outputs' strides are eager's
    if view:
        name = RESHAPE if name == VIEW else name
    else:
        args = _copied(lowering, args)
        kwargs = {k: _copied(lowering, v) for k, v in kwargs.items()}
    strides = meta_strides(torch_op(name), args, kwargs, plan)
    for vid, stride in zip(out, strides or ()):
        if stride is not None and plan.slot(vid).is_tensor:
            declare(plan, vid, stride)
    return name, args, kwargs


def _copied(lowering, a):
    """Encoded argument(s) `a` with each tensor an ATen kernel cannot take as it is replaced
    by a contiguous copy (one per use, in argument order)."""
    if isinstance(a, list):
        return [_copied(lowering, x) for x in a]
    if isinstance(a, dict) and "slot" in a and \
            not standard_layout(lowering.plan.slot(a["slot"])) and \
            not _as_eager(lowering, a["slot"]):
        return {"slot": contiguous_copy(lowering, a["slot"])}
    return a


def _contiguous_value(lowering, sid: int) -> bool:
    """Whether slot `sid` is contiguous and so is every value eager gave it (a slot codegen
    made, whose strides no eager value stands behind, counts when contiguous)."""
    if not lowering.plan.slot(sid).contiguous:
        return False
    values = lowering.values
    meta = values[sid] if sid < len(values) else None
    return not meta or "stride" not in meta or _is_dense(meta)


def _is_dense(meta: dict) -> bool:
    shape = [sym(d) for d in meta["shape"]]
    return same_strides(shape, meta["stride"], contiguous_strides(shape))


def _as_eager(lowering, sid: int) -> bool:
    """Whether slot `sid` is a graph value laid out as eager laid it out at export."""
    values = lowering.values
    meta = values[sid] if sid < len(values) else None
    if not meta or "stride" not in meta:
        return False
    slot = lowering.plan.slot(sid)
    return same_strides(dims(slot.shape), dims(slot.stride), meta["stride"])


def contiguous_copy(lowering, sid: int) -> int:
    """A copy of slot `sid` into a new contiguous slot (its id): a kernel, or with codegen
    off an ATen `clone` (an extern-only artifact has no kernels)."""
    src = lowering.realized(sid)
    if not lowering.codegen:
        out = lowering.new_slot(src.shape, src.dtype)
        lowering.plan.update(out, producer=StepKind.EXTERN)
        op = "aten::clone.default"
        lowering.out.steps.append(lowering.plan.call(
            op, [{"slot": sid}], {"memory_format": {"memory_format": "contiguous_format"}},
            [out]))
        lowering.out.fallback[op] = lowering.out.fallback.get(op, 0) + 1
        return out
    copy = lowering.pointwise(src.shape, src.dtype, src.loader, "layout_copy")
    return lowering.realize(copy).slot


def channels_last_conv(g, node: dict, args: list) -> bool:
    """A 2d convolution whose weight is a model weight takes it channels-last (converted
    once, at load) and so gives a channels-last output: its slot says so, so kernels index
    it as it is (a runtime whose convolution answers otherwise gets a copy, never a wrong
    read). Graph outputs keep eager's layout."""
    out, = node["out"]
    weight = args[1].get("slot") if isinstance(args[1], dict) else None
    meta = g.values[out]
    if (weight is None or g.plan.slot(weight).kind is not SlotKind.WEIGHT
            or g.users.get(weight, 0) != 1 or not meta or len(meta.get("shape", ())) != 4
            or node["args"][6] is True or out in g.graph_outputs):
        return False
    shape = [sym(d) for d in meta["shape"]]
    n, c, h, w = shape
    cl = (h * w * c, sym(1), w * c, c)
    g.plan.update(weight, memory_format="channels_last")
    g.plan.update(out, stride=size_texts(cl),
                  contiguous=same_strides(shape, cl, contiguous_strides(shape)))
    return True
