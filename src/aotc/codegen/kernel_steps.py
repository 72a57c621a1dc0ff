"""Scheduled kernels and the plan: the buffers a backend indexes, the buffers that must be
stored, and a generated kernel's plan step (its signature from the backend), made through the
entry's PlanBuilder (artifact/builder.py)."""
from __future__ import annotations

from aotc.artifact.dtypes import DTYPES
from aotc.artifact.schema.plan import CallStep, SlotRef
from aotc.artifact.schema.types import SlotKind, StepKind
from aotc.codegen.index_checks import kernel_checks
from aotc.codegen.ir import Buffer, dims
from aotc.codegen.scheduler import Kernel


def buffers_of(slots, steps: list = ()) -> dict:
    """The loop IR's buffer (name -> ir.Buffer) of every tensor slot (typed slots)."""
    constant = _constant_slots(slots, steps)
    return {f"buf{s.id}": Buffer(name=f"buf{s.id}", slot=s.id, shape=dims(s.shape),
                                 stride=dims(s.stride), dtype=DTYPES[s.dtype],
                                 constant=s.id in constant)
            for s in slots if s.is_tensor}


def _constant_slots(slots, steps) -> set[int]:
    """Slots no step writes: the weights and the views of them (in plan order)."""
    out = {s.id for s in slots if s.kind is SlotKind.WEIGHT}
    for step in steps:
        if isinstance(step, CallStep) and step.kind is StepKind.VIEW:
            base = step.args[0] if step.args else None
            if isinstance(base, SlotRef) and base.slot in out:
                out |= set(o for o in step.out if o is not None)
    return out


def stored_buffers(steps: list, outputs: list) -> set:
    """Kernel-written buffers that something outside their own kernel reads."""
    needed = {f"buf{o.slot}" for o in outputs if o.slot is not None}
    for step in steps:
        if isinstance(step, Kernel):
            needed |= step.reads - {b.name for b in step.writes}
            for node in step.nodes:   # pointwise results are always written to memory
                if not node.is_reduction:
                    needed |= {b.name for b in node.buffers}
        else:
            needed |= {f"buf{s}" for s in step.reads()}
    return needed


def kernel_step(plan, k: Kernel, signatures: dict):
    """The plan step of kernel `k` (`plan`: the entry's PlanBuilder), whose `signatures` entry
    (backend.Signature) the backend made."""
    ins, outs, sizes, launch = signatures[k.name]
    return plan.kernel(
        k.name, [int(n[3:]) for n in ins], [int(n[3:]) for n in outs], sizes=sizes,
        launch=launch,   # Triton kernels: grid over the size symbols, spec file, error code
        checks=kernel_checks(k, list(ins)),
        fused=[{"buffers": [b.name for b in n.buffers], "ops": list(n.body.origins)}
               for n in k.nodes],
        reasons=k.reasons)
