"""Scheduled kernels and the plan: the buffers a backend indexes, the buffers that must be
stored, and a generated kernel's plan step (its signature from the backend)."""
from __future__ import annotations

from aotc.artifact.dtypes import DTYPES
from aotc.artifact.encoding import SlotKind, StepKind
from aotc.codegen.index_checks import kernel_checks
from aotc.codegen.ir import Buffer, sym
from aotc.codegen.plan import step_uses
from aotc.codegen.scheduler import Kernel


def buffers_of(slots: list, steps: list = ()) -> dict:
    """The loop IR's buffer (name -> ir.Buffer) of every slot with a shape."""
    constant = _constant_slots(slots, steps)
    return {f"buf{s['id']}": Buffer(name=f"buf{s['id']}", slot=s["id"],
                                    shape=tuple(sym(d) for d in s["shape"]),
                                    stride=tuple(sym(d) for d in s["stride"]),
                                    dtype=DTYPES[s["dtype"]], constant=s["id"] in constant)
            for s in slots if "shape" in s}


def _constant_slots(slots: list, steps) -> set[int]:
    """Slots no step writes: the weights and the views of them (in plan order)."""
    out = {s["id"] for s in slots if s.get("kind") == SlotKind.WEIGHT.value}
    for step in steps:
        if isinstance(step, dict) and step.get("kind") == StepKind.VIEW.value:
            base = step["args"][0]
            if isinstance(base, dict) and base.get("slot") in out:
                out |= set(o for o in step.get("out", ()) if o is not None)
    return out


def stored_buffers(steps: list, outputs: list) -> set:
    """Kernel-written buffers that something outside their own kernel reads."""
    needed = {f"buf{o['slot']}" for o in outputs if "slot" in o}
    for step in steps:
        if isinstance(step, Kernel):
            needed |= step.reads - {b.name for b in step.writes}
            for node in step.nodes:   # pointwise results are always written to memory
                if not node.is_reduction:
                    needed |= {b.name for b in node.buffers}
        else:
            needed |= {f"buf{s}" for s in step_uses(step)}
    return needed


def kernel_step(k: Kernel, signatures: dict, slots: list) -> dict:
    """The plan step of kernel `k`, whose `signatures` entry (backend.Signature) the backend
    made."""
    ins, outs, sizes, launch = signatures[k.name]
    step = {"kind": StepKind.KERNEL.value, "name": k.name,
            "args": [int(n[3:]) for n in ins], "out": [int(n[3:]) for n in outs],
            "sizes": sizes,
            "fused": [{"buffers": [b.name for b in n.buffers], "ops": list(n.body.origins)}
                      for n in k.nodes],
            "reasons": k.reasons}
    if launch is not None:   # Triton kernels: grid over the size symbols, spec file, error code
        step["launch"] = launch
    checks = kernel_checks(k, list(ins))
    if checks:
        step["checks"] = checks
    return step
