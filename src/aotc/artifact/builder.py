"""The typed plan builder: how codegen writes plans/<entry>.json.

Codegen adds slots and makes steps through a `PlanBuilder`; every slot and step is checked
against the schema (artifact/schema/plan.py) the moment it is made, by the very parser loading
uses, so a plan the runtime would refuse fails at the codegen site that made it, as a
LoweringError naming the field, never at the end of an export as a "damaged artifact". A slot
is changed only through the builder (`update`), which checks it again; steps are frozen
dataclasses, revised with `revise`. `build` checks the whole plan as a program (artifact/schema/
flow.py) over the declared size symbols and returns the typed `Plan` that `Plan.to_json` writes.

Sizes are given as ints or expression text (codegen prints its sympy sizes with
`ir.size_texts`); call arguments in the encoding Programs carry (`encoding.encode_arg`: a tensor
as {"slot": n}, a symbolic integer as {"sym": "2*batch"}, torch enums tagged).
"""
from __future__ import annotations

from dataclasses import replace

from aotc.errors import ArtifactError, LoweringError
from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.fields import At
from aotc.artifact.schema.ops import is_extern_op
from aotc.artifact.schema.plan import (CallStep, FreeStep, IndexCheck, KernelStep, Launch,
                                       Output, Plan, Slot, parse_plan, parse_slot,
                                       parse_step)
from aotc.artifact.schema.types import SlotKind, StepKind

__all__ = ["PlanBuilder", "Output", "Launch", "IndexCheck", "size"]


def size(d):
    """One size as the schema holds it: an int, or the expression node of `d`'s text."""
    if isinstance(d, int) or not isinstance(d, str):
        return d
    try:
        return ex.parse_size(d)
    except ex.ExprError as e:
        raise LoweringError("codegen made a size the artifact format cannot express",
                            where="a plan slot or kernel step", found=d[:200],
                            expected="integer arithmetic (+ - * // % min max) over size "
                                     f"symbols ({e})",
                            fix="report this as an aotc bug with the model") from None


class PlanBuilder:
    """One entry's plan under construction: its slots, and the steps made for it."""

    def __init__(self, entry: str):
        self.entry = entry
        self.file = f"plans/{entry}.json (being built)"
        self._slots: list[Slot] = []

    # ---------------------------------------------------------------------------- slots
    def __len__(self) -> int:
        return len(self._slots)

    def slot(self, sid: int) -> Slot:
        return self._slots[sid]

    @property
    def slots(self) -> tuple:
        return tuple(self._slots)

    def add_slot(self, kind: SlotKind = SlotKind.VALUE, **fields) -> int:
        """A new slot (its id, the next one); `fields` as `Slot`'s, sizes as `size` takes."""
        sid = len(self._slots)
        self._slots.append(self._checked(Slot(id=sid, kind=kind, **_sized(fields))))
        return sid

    def update(self, sid: int, **changes) -> Slot:
        """Slot `sid` changed (its layout planned, its producer known), checked again."""
        slot = self._checked(replace(self._slots[sid], **_sized(changes)))
        self._slots[sid] = slot
        return slot

    def drop_last(self, sid: int) -> None:
        """Take back slot `sid`, the last one added (a spare no step names)."""
        if sid != len(self._slots) - 1:
            raise LoweringError("codegen dropped a slot that is not the last one",
                                where=self.file, expected=len(self._slots) - 1, found=sid,
                                fix="report this as an aotc bug with the model")
        self._slots.pop()

    def _checked(self, slot: Slot) -> Slot:
        return self._parsed(lambda: parse_slot(self._at(f"slots[{slot.id}]", slot.to_json()),
                                          slot.id, None))

    # ---------------------------------------------------------------------------- steps
    def call(self, op: str, args, kwargs: dict, out, *, view: bool = False,
             single: bool = True, source: str | None = None, binds: dict | None = None
             ) -> CallStep:
        """An EXTERN step (a VIEW one with `view`) calling ATen's `op` on `args` and `kwargs`
        in the Program encoding; `out` its result slots; `binds`: symbol -> [result, dim] for
        the value-dependent sizes its result defines."""
        if not is_extern_op(op):
            raise LoweringError(f"the model needs {op}, which aotc's runtime does not call",
                                where=f"plan {self.entry}", expected="an op of "
                                "artifact/schema/extern_ops.txt", found=op,
                                fix="report this op to aotc (it may need a lowering or a "
                                    "place in the op table), or export the model without it")
        doc = {"kind": (StepKind.VIEW if view else StepKind.EXTERN).value, "op": op,
               "args": list(args), "kwargs": dict(kwargs), "out": list(out), "single": single}
        if source is not None:
            doc["source"] = source
        if binds:
            doc["binds"] = binds
        return self._step(doc, op)

    def kernel(self, name: str, args, out, *, sizes=(), launch: Launch | None = None,
               checks=(), fused=(), reasons=()) -> KernelStep:
        """A step launching the generated kernel `name`: it reads the slots `args` and writes
        `out`; `sizes` are the size symbols passed after the pointers."""
        step = KernelStep(name=name, args=tuple(args), out=tuple(out), sizes=tuple(sizes),
                          launch=launch, checks=tuple(checks), fused=tuple(fused),
                          reasons=tuple(reasons))
        return self.revise(step)

    def free(self, slots, donate=()) -> FreeStep:
        return self.revise(FreeStep(slots=tuple(slots), donate=tuple(donate)))

    def revise(self, step, **changes):
        """`step` with `changes` (a kernel's `reuse`, a call's unread results dropped),
        checked again."""
        step = replace(step, **changes) if changes else step
        return self._step(step.to_json(), getattr(step, "op", None) or getattr(step, "name", ""))

    def _step(self, doc: dict, what: str):
        at = self._at(f"steps[{what}]", doc)
        return self._parsed(lambda: parse_step(at, len(self._slots), None))

    # ---------------------------------------------------------------------------- build
    def build(self, inputs, steps, outputs, stats: dict, symbols) -> Plan:
        """The typed plan, checked as a program over the declared size `symbols`."""
        plan = Plan(entry=self.entry, slots=tuple(self._slots), inputs=tuple(inputs),
                    steps=tuple(steps), outputs=tuple(outputs), stats=stats)
        return self._parsed(lambda: parse_plan(At.root(self.file, plan.to_json()), self.entry,
                                               set(symbols)))

    def _at(self, key: str, doc) -> At:
        return At(self.file, None, key, doc)

    @staticmethod
    def _parsed(parse):
        try:
            return parse()
        except ArtifactError as e:
            raise LoweringError(f"codegen built a plan its runtime refuses: {e.what}",
                                where=e.where, expected=e.expected, found=e.found,
                                fix="report this as an aotc bug with the model") from None


def _sized(fields: dict) -> dict:
    for key in ("shape", "stride"):
        if key in fields:
            fields[key] = tuple(size(d) for d in fields[key])
    return fields
