"""A plan's ATen call checked against the op's own schema before the plan function is built:
as many positional arguments as the op takes, keyword names it knows, and each argument of the
kind its schema declares (a tensor slot where a Tensor goes, integers where ints go, a string
only where a string goes, a list where a list goes). A plan that would only fail when called
(a TypeError deep in a call) is refused at load with an ArtifactError naming the step.
"""
from __future__ import annotations

from aotc.errors import ArtifactError
from aotc.artifact.schema.plan import SlotRef, SymArg, Tagged

_SCALAR_TAGS = ("dtype", "layout", "memory_format")


def check_call(op, step, slots) -> None:
    if step.op.startswith("aotc::"):    # aotc's own ops take positional tensors and numbers
        _check_aotc_call(step, slots)
        return
    schema = getattr(op, "_schema", None)   # an OpOverload (tests may substitute a function)
    if schema is None:
        return
    positional = [a for a in schema.arguments if not a.kwarg_only]
    by_name = {a.name: a for a in schema.arguments}
    if len(step.args) > len(positional):
        _fail(step, f"at most {len(positional)} positional arguments",
              f"{len(step.args)} arguments")
    pairs = list(zip(positional, step.args))
    for k, v in step.kwargs:
        if k not in by_name:
            _fail(step, f"arguments named {sorted(by_name)}", f"an argument {k!r}")
        pairs.append((by_name[k], v))
    for formal, value in pairs:
        if not _accepts(formal.type, value, slots):
            _fail(step, f"argument {formal.name!r} of type {formal.type}",
                  f"{type(value).__name__} {str(value)[:60]}")


_AOTC_KINDS = {"T": "a tensor slot", "i": "an int", "f": "a number"}


def _check_aotc_call(step, slots) -> None:
    from aotc.runtime.aotc_ops import OPS
    _, kinds, least = OPS[step.op]
    if not least <= len(step.args) <= len(kinds) or step.kwargs:
        _fail(step, f"{least}-{len(kinds)} positional arguments" if least < len(kinds)
              else f"{least} positional arguments",
              f"{len(step.args)} and {len(step.kwargs)} keywords")
    for i, (kind, a) in enumerate(zip(kinds, step.args)):
        ok = (isinstance(a, SlotRef) and slots[a.slot].is_tensor if kind == "T" else
              type(a) is int if kind == "i" else
              type(a) in (int, float) or (isinstance(a, Tagged) and a.tag == "float"))
        if not ok:
            _fail(step, f"argument {i}: {_AOTC_KINDS[kind]}",
                  f"{type(a).__name__} {str(a)[:60]}")


def _fail(step, expected, found):
    raise ArtifactError(f"the plan calls {step.op} with arguments its schema does not take",
                        where=f"plan step {step.op}", expected=expected, found=found,
                        fix="re-export the model with this torch version")


def _non_tensor_slot(a, slots) -> bool:
    return isinstance(a, SlotRef) and not slots[a.slot].is_tensor


def _is_int(a, slots) -> bool:
    return (type(a) is int or isinstance(a, SymArg) or _non_tensor_slot(a, slots)
            or (isinstance(a, Tagged) and a.tag in _SCALAR_TAGS))


def _accepts(t, a, slots) -> bool:
    kind = t.kind()
    if kind == "OptionalType":
        return a is None or _accepts(t.getElementType(), a, slots)
    if kind == "ListType":
        elem = t.getElementType()
        if isinstance(a, tuple):
            return all(_accepts(elem, x, slots) for x in a)
        return elem.kind() in ("IntType", "SymIntType") and _is_int(a, slots)  # int[2] = 3
    if kind == "TensorType":   # ATen wraps a number given for a tensor (add.Tensor(x, 1e-5))
        return (isinstance(a, SlotRef) and slots[a.slot].is_tensor) or \
            type(a) in (int, float, bool) or (isinstance(a, Tagged) and a.tag == "float")
    if kind in ("IntType", "SymIntType"):
        return _is_int(a, slots)
    if kind == "BoolType":
        return type(a) is bool or _non_tensor_slot(a, slots)
    if kind in ("FloatType", "NumberType"):
        return (type(a) in (int, float, bool) or isinstance(a, SymArg)
                or _non_tensor_slot(a, slots) or (isinstance(a, Tagged) and a.tag == "float"))
    if kind == "StringType":
        return isinstance(a, str)
    if kind == "DeviceObjType":
        return isinstance(a, Tagged) and a.tag == "device"
    if kind == "TupleType":
        return isinstance(a, tuple)
    return True     # generators, streams, ...: plans never pass them; ATen checks the rest
