"""A plan checked as a program: what each step reads is bound, what it binds is new.

Walking the steps in order with the set of bound slots (inputs and weights at the start): a step
reads only bound slots; an extern, view or kernel step binds value slots not bound before; a
kernel reads and writes tensors, and the storage it takes over (`reuse`) was donated by a free
step; a free step drops bound values or inputs; the outputs are bound at the end. So a parsed
plan runs without a name error, and no step reads a slot that a free step dropped.

Size symbols flow the same way: those the inputs' dims name are known at the start, a call's
`binds` make its result's value-dependent sizes known, and a step uses only known symbols (the
symbols its call binds in its results' shapes too).
"""
from __future__ import annotations

from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.fields import At
from aotc.artifact.schema.plan import arg_names
from aotc.artifact.schema.types import SlotKind, StepKind


def check_flow(plan, doc: At) -> None:
    slots = plan.slots
    steps_at = doc.get("steps")
    bound = {i for i, s in enumerate(slots) if s.kind in (SlotKind.WEIGHT, SlotKind.STATE)}
    inputs_at = doc.get("inputs")
    for i in plan.inputs:
        inputs_at.check(slots[i].kind is SlotKind.INPUT and i not in bound,
                        "input slots, each listed once", f"lists slot {i} ({slots[i].kind.value})")
        inputs_at.check(slots[i].producer is not StepKind.KERNEL, "inputs no kernel wrote",
                        f"says kernel for input slot {i}'s producer")
        bound.add(i)
    declared = {i for i, s in enumerate(slots) if s.kind is SlotKind.INPUT}
    inputs_at.check(declared == set(plan.inputs), "every input slot listed",
                    "misses an input slot")
    donated: set[int] = set()
    known = {d.name for i in plan.inputs for d in slots[i].shape if isinstance(d, ex.Sym)}
    for idx, step in enumerate(plan.steps):
        at = steps_at.child(idx, step)
        _check_step(step, slots, bound, donated, at)
        _check_symbols(step, slots, known, at)
    outs_at = doc.get("outputs")
    for o in plan.outputs:
        if o.slot is not None:
            outs_at.check(o.slot in bound, "outputs bound at the end of the plan",
                          f"names slot {o.slot}, which is not bound there")


def _check_step(step, slots, bound: set, donated: set, at: At) -> None:
    for r in step.reads():
        at.check(r in bound, f"slot {r} bound before this step",
                 f"reads slot {r}, which is not bound here (never bound, or freed)")
    if step.kind is StepKind.FREE:
        for s in (*step.slots, *step.donate):
            at.check(s in bound and slots[s].kind not in (SlotKind.WEIGHT, SlotKind.STATE),
                     "bound input or value slots", f"frees slot {s}, which it may not")
            bound.discard(s)
        donated |= set(step.donate)
        bound |= set(step.donate)     # donated storage stays bound until a kernel takes it
        return
    outs = [o for o in step.out if o is not None]
    for o in outs:
        at.check(slots[o].kind is SlotKind.VALUE and o not in bound,
                 "new value slots for what the step binds", f"binds slot {o} again")
        # the runners lay out and check a value no kernel wrote before a kernel reads it, and
        # trust the layout of one a kernel wrote (it allocated it from the slot)
        at.check(step.kind is StepKind.KERNEL or slots[o].producer is not StepKind.KERNEL,
                 "a slot said to be a kernel's bound by a kernel",
                 f"binds slot {o}, whose producer is 'kernel', in a {step.kind.value} step")
    if step.kind is StepKind.KERNEL:
        _check_kernel(step, slots, bound, donated, at)
    bound |= set(outs)


def _check_kernel(step, slots, bound: set, donated: set, at: At) -> None:
    for s in (*step.args, *step.out):
        at.check(slots[s].is_tensor, "tensor slots", f"passes slot {s}, which is no tensor")
    at.check(bool(step.out), "a kernel that writes at least one slot", "writes nothing")
    for out, donor in step.reuse:
        at.check(out in step.out and donor in donated and donor in bound,
                 "storage donated by an earlier free step", f"reuses slot {donor}")
        donated.discard(donor)
        bound.discard(donor)
    for c in step.checks:
        at.check(c.arg is None or c.arg < len(step.args),
                 f"an argument position below {len(step.args)}",
                 f"checks argument {c.arg}")
    if step.launch is not None:
        at.check(step.launch.spec == f"kernels/{step.name}.json",
                 f"the launch spec kernels/{step.name}.json", "names another file")
        for g in step.launch.grid:
            at.check(ex.names(g) <= set(step.sizes) | _shape_names(slots, step),
                     "a grid over the kernel's size symbols", "uses another symbol")


def _check_symbols(step, slots, known: set, at: At) -> None:
    """The step uses only known size symbols; what it binds is new, and a dim (or the integer)
    of one of its results that the result's slot names by that symbol."""
    binds = getattr(step, "binds", ())
    for b in binds:
        at.check(b.name not in known, "a size symbol bound once", f"binds {b.name} again")
        slot = step.out[b.out] if b.out < len(step.out) else None
        at.check(slot is not None, "a result the step keeps", f"binds {b.name} from result "
                 f"{b.out}")
        s = slots[slot]
        ok = not s.is_tensor if b.dim is None else (
            s.is_tensor and b.dim < len(s.shape) and isinstance(s.shape[b.dim], ex.Sym)
            and s.shape[b.dim].name == b.name)
        at.check(ok, f"a result whose slot has {b.name} there",
                 f"binds {b.name} from slot {slot} dim {b.dim}")
    new = {b.name for b in binds}
    outs = set(getattr(step, "out", ())) - {None}
    reads = step_symbols(step, slots, skip=outs)
    at.check(reads <= known, "size symbols the inputs or earlier steps bind",
             f"uses {sorted(reads - known)}, unbound here")
    written = step_symbols(step, slots, only=outs)
    at.check(written <= known | new, "size symbols the inputs or earlier steps bind",
             f"sizes its result with {sorted(written - known - new)}, unbound here")
    known |= new


def step_symbols(step, slots, *, skip: set = frozenset(), only: set | None = None) -> set[str]:
    """The size symbols a step uses: in its slots' shapes and strides (all but `skip`, or
    `only` those), its call's arguments, its kernel's sizes, grid and index checks."""
    if step.kind is StepKind.FREE:
        return set()
    used: set[str] = set()
    for s in (*step.reads(), *(o for o in step.out if o is not None)):
        if s in skip or (only is not None and s not in only) or not slots[s].is_tensor:
            continue
        for d in (*slots[s].shape, *slots[s].stride):
            if not isinstance(d, int):
                used |= ex.names(d)
    if only is not None:
        return used
    if step.kind is StepKind.KERNEL:
        used |= set(step.sizes)
        for g in (step.launch.grid if step.launch is not None else ()):
            used |= ex.names(g)
        for c in step.checks:
            used |= set() if isinstance(c.size, int) else ex.names(c.size)
    else:
        used |= arg_names((*step.args, *(v for _, v in step.kwargs)))
    return used


def _shape_names(slots, step) -> set[str]:
    names: set[str] = set()
    for s in (*step.args, *step.out):
        for d in (*slots[s].shape, *slots[s].stride):
            if not isinstance(d, int):
                names |= ex.names(d)
    return names


def check_against_entry(plan, spec, doc: At) -> None:
    """The plan takes the inputs and returns the outputs the manifest's entry declares."""
    ins, outs = doc.get("inputs"), doc.get("outputs")
    ins.check(len(plan.inputs) == len(spec.inputs),
              f"{len(spec.inputs)} inputs (as the manifest's entry declares)",
              f"lists {len(plan.inputs)}")
    for slot, want in zip(plan.inputs, spec.inputs):
        s = plan.slots[slot]
        ins.check(s.dtype == want.dtype and len(s.shape) == len(want.shape),
                  f"input {want.name!r} as {want.dtype} of rank {len(want.shape)}",
                  f"binds slot {slot} as {s.dtype} of rank {len(s.shape)}")
        for got, dim in zip(s.shape, want.shape):
            if isinstance(dim, int) or isinstance(got, int):
                ins.check(got == dim, f"input {want.name!r} with the manifest's sizes",
                          f"binds slot {slot} with other sizes")
    outs.check(len(plan.outputs) == len(spec.outputs),
               f"{len(spec.outputs)} outputs (as the manifest's entry declares)",
               f"lists {len(plan.outputs)}")
    for o, meta in zip(plan.outputs, spec.outputs):
        if o.slot is not None and meta is not None:
            outs.check(plan.slots[o.slot].dtype == meta.dtype,
                       f"outputs of the manifest's dtypes ({meta.dtype})",
                       f"returns slot {o.slot} as {plan.slots[o.slot].dtype}")


def check_states(plan, states: dict, doc: At) -> None:
    """Each state slot names a state of the manifest and has its dtype and shape."""
    slots = doc.get("slots")
    for s in plan.slots:
        if s.state is None:
            continue
        spec = states.get(s.state)
        slots.check(spec is not None and spec.dtype == s.dtype and spec.shape == s.shape,
                    f"state slots matching the manifest's state (one named {s.state!r})",
                    f"has slot {s.id} for state {s.state!r} as {s.dtype}{list(s.shape)}")


COLLECTIVES = frozenset({"aotc::all_reduce.default", "aotc::all_gather.default"})


def check_collectives(plan, world: int | None, doc: At) -> None:
    """Collective steps only in a tensor-parallel artifact, and gathers over its world size."""
    steps = doc.get("steps")
    for i, step in enumerate(plan.steps):
        op = getattr(step, "op", None)
        if op not in COLLECTIVES:
            continue
        at = steps.child(i, f"step {i}")
        at.check(world is not None, "collectives only in a tensor-parallel artifact "
                 "(manifest tensor_parallel)", f"calls {op}")
        if op == "aotc::all_gather.default" and len(step.args) == 3:
            at.check(step.args[2] == world and type(step.args[1]) is int,
                     f"a gather over the artifact's {world} ranks along a constant dim",
                     f"gathers over {step.args[2]!r}")
