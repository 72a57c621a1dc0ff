"""The launch plan of one entry point (plans/<entry>.json), typed.

A plan lists slots (one per value: an input, a weight or an intermediate, with its symbolic
shape, strides and dtype) and ordered steps (a generated kernel, an extern ATen call, an ATen
view, or a free). `parse_plan` checks every field and then the plan as a program: every slot a
step reads is bound earlier and not yet freed, outputs are bound at the end, kernels read and
write tensors, extern ops come from the fixed table (ops.py). Codegen writes plans through
`Plan.to_json`; nothing else produces or edits them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.fields import At
from aotc.artifact.schema.ops import is_extern_op
from aotc.artifact.schema.types import (DTYPE_SET, LAYOUT_SET, MEMORY_FORMAT_SET, SlotKind,
                                       StepKind, WEIGHT_NAME, size_json)

MAX_SLOTS = 1 << 20
# an entry's kernels: forward_kernel0, ...; decode_4_kernel0 for a decode bucket (format 22)
KERNEL_NAME = re.compile(r"(?:forward_|backward_|prefill_|decode_(?:[0-9]{1,4}_)?)?"
                         r"kernel[0-9]{1,7}\Z")
OP_NAME = re.compile(r"(?:aten|aotc)::[a-z_][a-z0-9_]{0,80}\.[A-Za-z_][A-Za-z0-9_]{0,40}\Z")
# the fields of each record (required, then the others allowed); scripts/gen_cpp_rules.py
# writes them into the C++ front end's rules.h, which checks plans by them too
PLAN_KEYS = (("entry", "slots", "inputs", "steps", "outputs"), ("stats",))
KERNEL_KEYS = (("kind", "name", "args", "out"),
               ("sizes", "reuse", "launch", "checks", "fused", "reasons"))
CALL_KEYS = (("kind", "op", "args", "kwargs", "out"), ("single", "source", "binds"))
FREE_KEYS = (("kind", "slots"), ("donate",))
LAUNCH_KEYS = (("grid", "spec"), ("error_code",))
CHECK_KEYS = (("arg", "size", "wraps", "op"), ())
OUTPUT_KEYS = ((), ("slot", "const"))
SLOT_LAYOUTS = frozenset({"transposed"})            # a weight slot's layout
SLOT_MEMORY_FORMATS = frozenset({"channels_last"})  # a weight slot's memory_format


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    id: int
    kind: SlotKind
    dtype: str | None = None            # None: not a tensor (an int or None an op returned)
    shape: tuple = ()                   # int | expr node per dim
    stride: tuple = ()
    contiguous: bool = True
    producer: StepKind | None = None    # the kind of step that binds it (values only)
    base: int | None = None             # the slot whose storage a view aliases
    weight: str | None = None           # WEIGHT: its name in the weights file
    state: str | None = None            # STATE: its name in the manifest's state
    name: str | None = None             # INPUT: the model's argument name
    layout: str | None = None           # WEIGHT: "transposed" (stored as [K, N])
    memory_format: str | None = None    # WEIGHT: "channels_last" (converted at load)

    @property
    def is_tensor(self) -> bool:
        return self.dtype is not None

    def to_json(self) -> dict:
        out = {"id": self.id, "kind": self.kind.value}
        if self.is_tensor:
            out.update(dtype=self.dtype, shape=size_json(self.shape),
                       stride=size_json(self.stride), contiguous=self.contiguous)
        for key in ("base", "weight", "state", "name", "layout", "memory_format"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.producer is not None:
            out["producer"] = self.producer.value
        return out


# ------------------------------------------------------------------------------- arguments
@dataclass(frozen=True, slots=True)
class SlotRef:
    slot: int


@dataclass(frozen=True, slots=True)
class SymArg:
    expr: object        # an expr node


@dataclass(frozen=True, slots=True)
class Tagged:
    """A torch enum or special float: tag in TAGS, value its name ("float32", "inf")."""
    tag: str
    value: str


TAGS = {"dtype": DTYPE_SET, "layout": LAYOUT_SET, "memory_format": MEMORY_FORMAT_SET,
        "device": frozenset({"cpu", "cuda"}), "float": frozenset({"inf", "-inf", "nan"})}
ARG_KEYS = ("slot", "sym", *TAGS)   # a tagged argument's one key


def arg_json(a):
    if isinstance(a, tuple):
        return [arg_json(x) for x in a]
    if isinstance(a, SlotRef):
        return {"slot": a.slot}
    if isinstance(a, SymArg):
        return {"sym": ex.text(a.expr)}
    if isinstance(a, Tagged):
        return {a.tag: a.value}
    return a


def slot_refs(a) -> list[int]:
    """The slots an argument (or a tuple of them) refers to."""
    if isinstance(a, tuple):
        return [s for x in a for s in slot_refs(x)]
    return [a.slot] if isinstance(a, SlotRef) else []


def arg_names(args) -> set[str]:
    """The size symbols a call's arguments name."""
    out: set[str] = set()
    for a in args:
        if isinstance(a, tuple):
            out |= arg_names(a)
        elif isinstance(a, SymArg):
            out |= ex.names(a.expr)
    return out


# ----------------------------------------------------------------------------------- steps
@dataclass(frozen=True, slots=True)
class Bind:
    """A size symbol a call's result defines (a value-dependent size: `x[mask]`'s rows): the
    dim `dim` of result `out` (None: the result is that integer), within [lo, hi], the range
    the manifest declares for it (checked at each call before any later step runs)."""
    name: str
    out: int
    dim: int | None
    lo: int = 0
    hi: int = ex.MAX_INT

    def to_json(self) -> list:
        return [self.out, self.dim]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallStep:
    """An ATen call: EXTERN (into new storage) or VIEW (aliasing its first argument)."""
    kind: StepKind
    op: str
    args: tuple
    kwargs: tuple                      # ((name, arg), ...) in name order
    out: tuple                         # slot | None per result
    single: bool = True                # the op returns one value (not a tuple)
    source: str | None = None          # display only: the model's line that produced it
    binds: tuple = ()                  # Bind per size symbol its result defines (format 16)

    def reads(self) -> list[int]:
        return slot_refs(self.args) + slot_refs(tuple(v for _, v in self.kwargs))

    def to_json(self) -> dict:
        out = {"kind": self.kind.value, "op": self.op, "args": arg_json(self.args),
               "kwargs": {k: arg_json(v) for k, v in self.kwargs}, "out": list(self.out),
               "single": self.single}
        if self.source is not None:
            out["source"] = self.source
        if self.binds:
            out["binds"] = {b.name: b.to_json() for b in self.binds}
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """How a Triton kernel (CUDA artifact) is launched: grid over the size symbols, its launch
    spec file, the error code it stores for an index out of range."""
    grid: tuple                        # three expr nodes
    spec: str
    error_code: int | None = None

    def to_json(self) -> dict:
        return {"grid": [ex.text(g) for g in self.grid], "spec": self.spec,
                "error_code": self.error_code}


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexCheck:
    """An index a kernel reads at run time: which argument holds it, the size it indexes,
    whether negative indices wrap (aten.index) or are refused (embedding, gather)."""
    arg: int | None                    # position in the kernel's args (None: computed inside)
    size: object                       # expr node
    wraps: bool
    op: str                            # the ATen op that indexes, for the error message

    def to_json(self) -> dict:
        return {"arg": self.arg, "size": size_json((self.size,))[0], "wraps": self.wraps,
                "op": self.op}


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelStep:
    kind: StepKind = StepKind.KERNEL
    name: str
    args: tuple                        # slots read
    out: tuple                         # slots written
    sizes: tuple = ()                  # size symbols passed after the pointers
    reuse: tuple = ()                  # ((out slot, donor slot), ...): storage taken over
    launch: Launch | None = None
    checks: tuple = ()                 # IndexCheck, ...
    fused: tuple = ()                  # display only: ({"buffers": [...], "ops": [...]}, ...)
    reasons: tuple = ()                # display only: fusion decisions

    def reads(self) -> list[int]:
        return list(self.args)

    def to_json(self) -> dict:
        out = {"kind": self.kind.value, "name": self.name, "args": list(self.args),
               "out": list(self.out), "sizes": list(self.sizes),
               "fused": [dict(f) for f in self.fused], "reasons": list(self.reasons)}
        if self.reuse:
            out["reuse"] = {str(o): d for o, d in self.reuse}
        if self.launch is not None:
            out["launch"] = self.launch.to_json()
        if self.checks:
            out["checks"] = [c.to_json() for c in self.checks]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class FreeStep:
    kind: StepKind = StepKind.FREE
    slots: tuple                       # dropped
    donate: tuple = ()                 # dead, but kept bound for a later kernel's `reuse`

    def reads(self) -> list[int]:
        return []

    def to_json(self) -> dict:
        out = {"kind": self.kind.value, "slots": list(self.slots)}
        if self.donate:
            out["donate"] = list(self.donate)
        return out


Step = CallStep | KernelStep | FreeStep


@dataclass(frozen=True, slots=True)
class Output:
    """A plan output: a slot, or a constant the model returned (None, a number)."""
    slot: int | None = None
    const: object = None

    def to_json(self) -> dict:
        return {"slot": self.slot} if self.slot is not None else {"const": self.const}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    entry: str
    slots: tuple
    inputs: tuple
    steps: tuple
    outputs: tuple
    stats: dict = field(default_factory=dict)

    @property
    def symbols(self) -> set[str]:
        """Size symbols any slot's shape or stride uses."""
        out: set[str] = set()
        for s in self.slots:
            for d in (*s.shape, *s.stride):
                if not isinstance(d, int):
                    out |= ex.names(d)
        return out

    def to_json(self) -> dict:
        return {"entry": self.entry, "slots": [s.to_json() for s in self.slots],
                "inputs": list(self.inputs), "steps": [s.to_json() for s in self.steps],
                "outputs": [o.to_json() for o in self.outputs], "stats": self.stats}


# ----------------------------------------------------------------------------------- parse
def parse_plan(doc: At, entry: str, symbols, spec=None) -> Plan:
    """A plan from its JSON, checked field by field and as a program (see the module doc),
    and, given the manifest's EntrySpec, against the inputs and outputs it declares."""
    doc.obj(*PLAN_KEYS)
    doc.get("entry").check(doc.get("entry").value == entry, f"the entry name {entry!r}",
                           "names another entry")
    slots = tuple(parse_slot(a, i, symbols)
                  for i, a in enumerate(doc.get("slots").list(MAX_SLOTS)))
    n = len(slots)
    inputs = doc.ints_of("inputs", n - 1)
    steps = tuple(parse_step(a, n, symbols) for a in doc.get("steps").list())
    outputs = tuple(_output(a, n) for a in doc.get("outputs").list())
    if spec is not None:   # the ranges value-dependent sizes are checked against
        steps = tuple(with_ranges(s, spec.symbols) for s in steps)
    from aotc.artifact.schema.manifest import display
    plan = Plan(entry=entry, slots=slots, inputs=inputs, steps=steps, outputs=outputs,
                stats=display(doc.get("stats", {})))
    from aotc.artifact.schema.flow import check_flow, check_against_entry
    check_flow(plan, doc)
    if spec is not None:
        check_against_entry(plan, spec, doc)
    return plan


_SLOT_KEYS = ("id", "kind", "dtype", "shape", "stride", "contiguous", "producer", "base",
              "weight", "state", "name", "layout", "memory_format")


_SLOT_KEY_SET = frozenset(_SLOT_KEYS)
_KINDS = {k.value: k for k in SlotKind}
_PRODUCERS = {k.value: k for k in StepKind}


def parse_slot(a: At, i: int, symbols) -> Slot:
    """Slot `i` of a plan, checked field by field (the builder checks each slot it makes)."""
    v = a.keys_within(("id", "kind"), _SLOT_KEY_SET).value
    if v["id"] != i:
        a.get("id").fail(f"slot id {i} (its position)", problem="is out of order")
    kind = _KINDS.get(v["kind"]) or a.get("kind").enum(SlotKind)
    fields = {}
    if "dtype" in v:
        shape = a.sizes_of("shape", symbols)
        stride = a.sizes_of("stride", symbols)
        if len(stride) != len(shape):
            a.get("stride").fail(f"{len(shape)} strides (one per dim)",
                                 problem="has the wrong length")
        fields.update(dtype=a.str_of("dtype", DTYPE_SET), shape=shape, stride=stride,
                      contiguous=a.bool_of("contiguous"))
    else:
        for k in ("shape", "stride", "contiguous"):
            a.check(k not in v, "a non-tensor slot without shape", f"has {k} but no dtype")
    if "producer" in v:
        fields["producer"] = _PRODUCERS.get(v["producer"]) or a.get("producer").enum(StepKind)
    if "base" in v:
        fields["base"] = a.int_of("base", 0, MAX_SLOTS)
    if kind is SlotKind.WEIGHT:
        fields["weight"] = a.get("weight").str(pattern=WEIGHT_NAME, max_len=1024)
        if "layout" in v:
            fields["layout"] = a.str_of("layout", SLOT_LAYOUTS)
        if "memory_format" in v:
            fields["memory_format"] = a.str_of("memory_format", SLOT_MEMORY_FORMATS)
    elif kind is SlotKind.INPUT:
        fields["name"] = a.get("name").str(pattern=WEIGHT_NAME, max_len=256)
    elif kind is SlotKind.STATE:
        fields["state"] = a.get("state").str(pattern=WEIGHT_NAME, max_len=1024)
    for k in ("weight", "state", "layout", "memory_format", "name"):
        if k in v and k not in fields:
            a.fail(f"no {k} on a {kind.value} slot", problem=f"has a {k}")
    a.check(kind not in (SlotKind.WEIGHT, SlotKind.STATE) or "dtype" in v,
            f"a {kind.value} slot with a dtype", "is no tensor")
    return Slot(id=i, kind=kind, **fields)


def _arg(a: At, n: int, symbols, depth: int = 0):
    v = a.value
    t = type(v)
    if (t is int and -ex.MAX_INT - 1 <= v <= ex.MAX_INT) or t is bool or v is None:
        return v
    if t is dict and len(v) == 1 and type(v.get("slot")) is int and 0 <= v["slot"] < n:
        return SlotRef(v["slot"])
    if isinstance(v, list):
        a.check(depth < 4, "arguments nested at most 4 lists deep", "is nested too deeply")
        return tuple(_arg(x, n, symbols, depth + 1) for x in a.list(1 << 16))
    if isinstance(v, dict):
        a.obj(optional=ARG_KEYS)
        a.check(len(v) == 1, "one tag: slot, sym, dtype, layout, memory_format, device, float")
        (tag, _), = v.items()
        if tag == "slot":
            return SlotRef(a.get("slot").int(0, n - 1))
        if tag == "sym":
            return SymArg(a.get("sym").expr(symbols))
        return Tagged(tag, a.get(tag).str(choices=TAGS[tag]))
    if isinstance(v, str):
        return a.str(max_len=256)
    if isinstance(v, float):
        a.check(math.isfinite(v), "a finite number (inf and nan are tagged)")
        return v
    if v is None or isinstance(v, (bool, int)):
        return a.int(-ex.MAX_INT - 1, ex.MAX_INT) if type(v) is int else v
    a.fail("an argument: a number, a string, a list or a tagged value")


_CALL_KEYS = frozenset(CALL_KEYS[0] + CALL_KEYS[1])
_FREE_KEYS = frozenset(FREE_KEYS[0] + FREE_KEYS[1])


def parse_step(a: At, n: int, symbols) -> Step:
    """One step of a plan of `n` slots, checked field by field (not yet as a program)."""
    v = a.value
    kind = _PRODUCERS.get(v.get("kind")) if type(v) is dict else None
    if kind is None:
        kind = a.get("kind").enum(StepKind)
    if kind is StepKind.FREE:
        a.keys_within(FREE_KEYS[0], _FREE_KEYS)
        return FreeStep(slots=a.ints_of("slots", n - 1), donate=a.ints_of("donate", n - 1, []))
    if kind is StepKind.KERNEL:
        return _kernel_step(a, n, symbols)
    a.keys_within(CALL_KEYS[0], _CALL_KEYS)
    op = v["op"]
    if not (type(op) is str and is_extern_op(op)):
        a.get("op").str(pattern=OP_NAME, max_len=128)
        a.get("op").fail("an ATen op aotc's codegen emits (the runtime's op table)",
                         problem="is not an op aotc calls")
    kw = a.get("kwargs")   # in name order, as stored (so a plan equals its stored form)
    kwargs = tuple(sorted(((k, _arg(x, n, symbols)) for k, x in kw.items(64)),
                          key=lambda kv: kv[0]))
    for k, x in kw.items(64):
        x.check(bool(ex.NAME_RE.match(k)), "an argument name (an identifier)", "is not a name")
    args = a.get("args")
    args.list(64)
    return CallStep(kind=kind, op=op,
                    args=tuple(_arg(args.child(i, x), n, symbols)
                               for i, x in enumerate(args.value)),
                    kwargs=kwargs, out=a.ints_of("out", n - 1, nullable=True),
                    single=a.bool_of("single") if "single" in v else True,
                    source=a.get("source").str(pattern=WEIGHT_NAME, max_len=1024)
                    if "source" in v else None,
                    binds=_binds(a.get("binds"), symbols) if "binds" in v else ())


def _binds(a: At, symbols) -> tuple:
    out = []
    for name, b in a.items(16):   # names reach the plan function's source: identifiers only
        b.check(bool(ex.NAME_RE.match(name)) and (symbols is None or name in symbols),
                "a symbol the manifest declares", f"binds {name[:40]!r}")
        pos, dim = b.list(2, 2)
        out.append(Bind(name, pos.int(0, 64), None if dim.is_null() else dim.int(0, 15)))
    return tuple(out)


def with_ranges(step, symbols: dict):
    """`step` with its binds' ranges from the manifest's symbols."""
    if not getattr(step, "binds", ()):
        return step
    import dataclasses
    binds = tuple(Bind(b.name, b.out, b.dim, symbols[b.name].min, symbols[b.name].max)
                  for b in step.binds)
    return dataclasses.replace(step, binds=binds)


def _kernel_step(a: At, n: int, symbols) -> KernelStep:
    a.obj(*KERNEL_KEYS)
    sizes = tuple(s.ident() for s in a.get("sizes", []).list(64))
    for s in a.get("sizes", []).list(64):
        if symbols is not None and s.value not in symbols:
            s.fail(f"a declared symbol {sorted(symbols)}", problem="is not a declared size symbol")
    reuse = tuple((_slot_key(d, k, n), d.int(0, n - 1))
                  for k, d in a.get("reuse", {}).items(1 << 12))
    launch = None
    if a.has("launch"):
        la = a.get("launch").obj(*LAUNCH_KEYS)
        grid = la.get("grid").list(3, 3)
        code = la.get("error_code", None)
        launch = Launch(grid=tuple(g.expr(symbols) for g in grid),
                        spec=la.get("spec").str(max_len=256),
                        error_code=None if code.is_null() else code.int(1, 1 << 30))
    checks = tuple(_check(c, symbols) for c in a.get("checks", []).list(64))
    fused = a.get("fused", [])
    reasons = a.get("reasons", [])
    return KernelStep(name=a.get("name").str(pattern=KERNEL_NAME, max_len=64),
                      args=a.ints_of("args", n - 1), out=a.ints_of("out", n - 1),
                      sizes=sizes, reuse=reuse,
                      launch=launch, checks=checks,
                      fused=tuple(f.obj(optional=("buffers", "ops")).value
                                  for f in fused.list()),
                      reasons=tuple(r.text() for r in reasons.list()))


def _slot_key(at: At, key: str, n: int) -> int:
    at.check(key.isdigit() and len(key) < 8 and int(key) < n, f"a slot number below {n}",
             "is not a slot")
    return int(key)


def _check(c: At, symbols) -> IndexCheck:
    c.obj(*CHECK_KEYS)
    arg = c.get("arg")
    return IndexCheck(arg=None if arg.is_null() else arg.int(0, 4096),
                      size=c.get("size").size(symbols),
                      wraps=c.get("wraps").bool(), op=c.get("op").str(pattern=OP_NAME))


def _output(a: At, n: int) -> Output:
    a.obj(*OUTPUT_KEYS)
    a.check(a.has("slot") != a.has("const"), "either a slot or a constant")
    if a.has("slot"):
        return Output(slot=a.get("slot").int(0, n - 1))
    c = a.get("const")
    c.check(c.value is None or isinstance(c.value, (bool, int, float, str)),
            "a constant: null, a boolean, a number or a string")
    if isinstance(c.value, str):
        c.text(256)
    return Output(const=c.value)
