"""Weight layouts on GPUs: a [K, N] product operand stored as its [N, K] transpose.

A weight that products read as it is, `mm(x, W)` / `addmm(b, x, W)` with W of shape [K, N]
stored row-major (GPT-2's Conv1D layers), makes a product of one row (a decode step at batch 1,
codegen/lowering/matvec.py) an outer reduction: the K weights of one output lie N elements
apart, so each program reduces a block of columns over all of K. For N of a few thousand that
gives a few dozen programs, too few for the device, and the reduction is split in two stages:
two kernels at every product. (nn.Linear reaches the plan as `mm(x, permute(W))` of an [N, K]
W, whose permuted view already has the layout this gives.)

Stored as W^T ([N, K], row-major) and bound at load as its transpose view (a view: no copy),
the same logical [K, N] operand has strides [1, K]: each output's weights are contiguous, the
product is an inner reduction with one program per block of output rows, in one kernel.
Products of more rows stay cuBLAS calls, which take either layout.

A weight qualifies in CUDA inference when it is 2-d, contiguous, not tied to another name,
and every use of it in every entry is the right operand of `mm` or `addmm`. Its plan slots say
`"layout": "transposed"` with strides [1, K]; the manifest lists it among the transposed
weights (swap-weights and tensor-parallel ranks store theirs alike), as for the CPU's
layouts (codegen/layouts.py).
"""
from __future__ import annotations

from aotc.artifact.encoding import SlotKind

RIGHT_OPERAND = {"aten::mm.default": 1, "aten::addmm.default": 2}


def transposed_operands(graphs: dict, tied: set) -> list[str]:
    """The weight names to store transposed (see the module docstring), sorted."""
    verdict: dict[str, bool] = {}
    for graph in graphs.values():
        by_value = {inp["value"]: inp["name"] for inp in graph["inputs"]
                    if inp["kind"] == "weight"}
        uses = _uses(graph, set(by_value))
        for value, name in by_value.items():
            meta = graph["values"][value] or {}
            ok = name not in tied and _row_major_2d(meta) and bool(uses.get(value)) and \
                all(pos == RIGHT_OPERAND.get(op) for op, pos in uses[value])
            verdict[name] = verdict.get(name, True) and ok
    return sorted(n for n, ok in verdict.items() if ok)


def _uses(graph: dict, values: set) -> dict[int, list]:
    """value -> [(op, positional index)] of each use of it; a use that is not a positional
    argument of a node (a keyword, a nested list, a graph output) counts as (None, None)."""
    uses: dict[int, list] = {}

    def visit(a, op, pos):
        if isinstance(a, (list, tuple)):
            for x in a:
                visit(x, None, None)
        elif isinstance(a, dict) and a.get("slot") in values:
            uses.setdefault(a["slot"], []).append((op, pos))
    for node in graph["nodes"]:
        for pos, a in enumerate(node["args"]):
            visit(a, node["op"], pos)
        visit(list(node["kwargs"].values()), None, None)
    for o in graph["outputs"]:
        visit(o, None, None)
    return uses


def _row_major_2d(meta: dict) -> bool:
    shape, stride = meta.get("shape"), meta.get("stride")
    return isinstance(shape, list) and len(shape) == 2 and \
        all(isinstance(d, int) and d > 1 for d in shape) and stride == [shape[1], 1]


def with_transposed(graph: dict, names: list[str]) -> dict:
    """`graph` with the named weights' values given strides [1, K] (a copy; the program's
    graph is left as it is): lowering then indexes them as the transposed storage holds them."""
    chosen = {inp["value"] for inp in graph["inputs"]
              if inp["kind"] == "weight" and inp["name"] in names}
    if not chosen:
        return graph
    values = list(graph["values"])
    for v in chosen:
        k = values[v]["shape"][0]
        values[v] = dict(values[v], stride=[1, k])
    return dict(graph, values=values)


def mark_transposed(plan, names: list[str]) -> None:
    """Say `"layout": "transposed"` on the weight slots of the named weights (`plan`: a
    PlanBuilder)."""
    for s in plan.slots:
        if s.kind is SlotKind.WEIGHT and s.weight in names:
            plan.update(s.id, layout="transposed")
