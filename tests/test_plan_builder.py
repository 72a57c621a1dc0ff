"""The typed plan builder (artifact/builder.py): what it builds parses through the schema and
round-trips, and a slot or step the schema refuses fails where it is made, as a LoweringError
naming the field, never at the end of the export as a damaged artifact."""
from __future__ import annotations

import json

import pytest
import torch

from aotc.artifact.builder import Launch, Output, PlanBuilder, size
from aotc.artifact.schema import At, parse_plan
from aotc.artifact.schema.plan import CallStep, KernelStep, SlotRef
from aotc.artifact.schema.types import SlotKind, StepKind
from aotc.errors import LoweringError


def _linear_plan() -> tuple[PlanBuilder, list, list]:
    """x [batch, 4] -> relu(x @ W^T + b) -> a view, through every step kind."""
    b = PlanBuilder("forward")
    w = b.add_slot(SlotKind.WEIGHT, weight="fc.weight", dtype="float32", shape=[8, 4],
                   stride=[4, 1])
    bias = b.add_slot(SlotKind.WEIGHT, weight="fc.bias", dtype="float32", shape=[8],
                      stride=[1])
    x = b.add_slot(SlotKind.INPUT, name="x", dtype="float32", shape=["batch", 4],
                   stride=[4, 1])
    wt = b.add_slot(dtype="float32", shape=[4, 8], stride=[1, 4], contiguous=False,
                    producer=StepKind.VIEW)
    y = b.add_slot(dtype="float32", shape=["batch", 8], stride=[8, 1],
                   producer=StepKind.EXTERN)
    r = b.add_slot(dtype="float32", shape=["batch", 8], stride=[8, 1])
    b.update(r, producer=StepKind.KERNEL)
    flat = b.add_slot(dtype="float32", shape=["8*batch"], stride=[1], producer=StepKind.VIEW)
    steps = [
        b.call("aten::permute.default", [{"slot": w}, [1, 0]], {}, [wt], view=True),
        b.call("aten::addmm.default", [{"slot": bias}, {"slot": x}, {"slot": wt}], {}, [y],
               source="model.py:3"),
        b.kernel("kernel0", [y], [r], sizes=["batch"],
                 fused=[{"buffers": [f"buf{r}"], "ops": ["relu"]}], reasons=["starts"]),
        b.free([x, wt, y]),
        b.call("aten::view.default", [{"slot": r}, [{"sym": "8*batch"}]], {}, [flat],
               view=True),
    ]
    return b, [x], steps


def test_built_plan_parses_and_round_trips():
    b, inputs, steps = _linear_plan()
    plan = b.build(inputs, steps, [Output(slot=6), Output(const=None)], {"kernels": 1},
                   {"batch"})
    assert [s.kind for s in plan.steps] == [StepKind.VIEW, StepKind.EXTERN, StepKind.KERNEL,
                                            StepKind.FREE, StepKind.VIEW]
    assert isinstance(plan.steps[1], CallStep) and plan.steps[1].args[1] == SlotRef(2)
    assert isinstance(plan.steps[2], KernelStep) and plan.steps[2].sizes == ("batch",)
    doc = json.loads(json.dumps(plan.to_json()))          # the bytes a plan file holds
    again = parse_plan(At.root("plans/forward.json", doc), "forward", {"batch"})
    assert again == plan and again.to_json() == doc
    assert plan.slots[3].producer is StepKind.VIEW and plan.slots[5].producer is StepKind.KERNEL


def test_revised_steps_are_checked_again():
    b, inputs, steps = _linear_plan()
    addmm = b.revise(steps[1], out=(None,))
    assert addmm.out == (None,) and steps[1].out == (4,)     # frozen: a new step
    with pytest.raises(LoweringError, match="steps\\[aten::addmm.default\\]"):
        b.revise(steps[1], out=(99,))


@pytest.mark.parametrize("make,field", [
    (lambda b: b.add_slot(dtype="float128", shape=[2], stride=[1]), "slots[0].dtype"),
    (lambda b: b.add_slot(SlotKind.WEIGHT, dtype="float32", shape=[2], stride=[1]),
     "slots[0].weight"),
    (lambda b: b.add_slot(dtype="float32", shape=[2, 3], stride=[1]), "slots[0].stride"),
    (lambda b: b.add_slot(SlotKind.INPUT, name="x", weight="w", dtype="float32", shape=[2],
                          stride=[1]), "slots[0]"),
    (lambda b: b.add_slot(dtype="float32", shape=[2] * 17, stride=[1] * 17), "slots[0].shape"),
])
def test_a_bad_slot_fails_where_it_is_added(make, field):
    b = PlanBuilder("forward")
    with pytest.raises(LoweringError) as e:
        make(b)
    assert field in e.value.where and "being built" in e.value.where
    assert len(b) == 0                                       # nothing half-added


def test_a_bad_update_leaves_the_slot_as_it_was():
    b = PlanBuilder("forward")
    s = b.add_slot(dtype="float32", shape=[2], stride=[1])
    with pytest.raises(LoweringError, match="dtype"):
        b.update(s, dtype="float128")
    assert b.slot(s).dtype == "float32"


def test_a_bad_step_fails_where_it_is_made():
    b = PlanBuilder("forward")
    x = b.add_slot(SlotKind.INPUT, name="x", dtype="float32", shape=[2], stride=[1])
    with pytest.raises(LoweringError, match="aten::system.default"):
        b.call("aten::system.default", [{"slot": x}], {}, [x])
    with pytest.raises(LoweringError) as e:          # a slot the plan does not have
        b.call("aten::relu.default", [{"slot": 5}], {}, [x])
    assert "steps[aten::relu.default].args" in e.value.where
    with pytest.raises(LoweringError, match="kwargs"):
        b.call("aten::relu.default", [{"slot": x}], {"not a name": 1}, [x])
    with pytest.raises(LoweringError, match="name"):
        b.kernel("kernel0; rm -rf", [x], [x])
    with pytest.raises(LoweringError, match="sizes"):   # the format's limit: 64 sizes
        b.kernel("kernel0", [x], [x], sizes=[f"s{i}" for i in range(65)])
    with pytest.raises(LoweringError, match="launch"):
        b.kernel("kernel0", [x], [x], launch=Launch(grid=(size("1"),) * 3, spec="k.json",
                                                    error_code=0))


def test_build_checks_the_plan_as_a_program():
    b = PlanBuilder("forward")
    x = b.add_slot(SlotKind.INPUT, name="x", dtype="float32", shape=["n"], stride=[1])
    y = b.add_slot(dtype="float32", shape=["n"], stride=[1], producer=StepKind.EXTERN)
    z = b.add_slot(dtype="float32", shape=["n"], stride=[1], producer=StepKind.EXTERN)
    steps = [b.call("aten::relu.default", [{"slot": y}], {}, [z]),    # y is never bound
             b.call("aten::relu.default", [{"slot": x}], {}, [y])]
    with pytest.raises(LoweringError, match="not bound") as e:
        b.build([x], steps, [Output(slot=z)], {}, {"n"})
    assert "steps[0]" in e.value.where
    with pytest.raises(LoweringError, match="declared symbol|symbol"):
        b.build([x], steps[::-1], [Output(slot=z)], {}, {"m"})      # n is not declared
    assert b.build([x], steps[::-1], [Output(slot=z)], {}, {"n"}).outputs == (Output(slot=z),)


def test_codegen_builds_its_plans_typed():
    """An MLP lowered and finished by codegen: a typed Plan, whose stored form parses back to
    the same plan."""
    from aotc.codegen import lower_and_schedule
    from aotc.codegen.stages import Schedule, entry_plan
    from aotc.exporter import trace_function

    w1, w2 = torch.randn(8, 4), torch.randn(2, 8)
    program = trace_function(lambda x: torch.nn.functional.gelu(x @ w1.t()) @ w2.t(),
                             (torch.randn(3, 4),))
    lowered, steps, decisions = lower_and_schedule(program, codegen=False)
    entry = Schedule(lowered=lowered, steps=steps, decisions=decisions, kernels=[])
    plan = entry_plan(entry, {}, {}, program.symbols)
    assert {s.kind for s in plan.steps} >= {StepKind.EXTERN, StepKind.FREE}
    doc = json.loads(json.dumps(plan.to_json()))
    assert parse_plan(At.root("plans/forward.json", doc), "forward", set(program.symbols)) == plan


def test_codegen_fails_at_the_step_the_schema_refuses(monkeypatch):
    """An extern step outside the runtime's op table stops the export while the graph is
    lowered (no kernel compiled, nothing written), naming the op."""
    import aotc.artifact.builder as builder
    from aotc.codegen import lower_and_schedule
    from aotc.exporter import trace_function

    monkeypatch.setattr(builder, "is_extern_op", lambda op: op != "aten::mm.default")
    w = torch.randn(4, 8)
    program = trace_function(lambda x: torch.relu(x @ w), (torch.randn(3, 4),))
    with pytest.raises(LoweringError, match="aten::mm.default, which aotc's runtime") as e:
        lower_and_schedule(program)
    assert e.value.where == "plan forward"
