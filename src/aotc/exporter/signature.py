"""The exported entry's call signature: the model's own forward parameter names, recorded so a
loaded artifact binds keyword arguments as the model does (manifest `parameters`, format 20;
artifact/schema/params.py holds the rules, runtime/binding.py the binding).

What is recorded is a prefix of forward's positional parameters: the ones the example inputs
filled (required: the graph needs those tensors), then the following ones while each has a
default the manifest can hold (None, a boolean, a number, a short string): the plan was traced
with that value, so a call may leave it out or pass an equal value. A tensor default, a
keyword-only parameter or `*args` ends the prefix (such parameters are not accepted by name).
No names are recorded for a forward whose inputs have no real names (`forward(*xs)`) or are
positional-only (`forward(self, x, /)`): those artifacts take positional arguments only.
"""
from __future__ import annotations

import inspect

from aotc.artifact.schema.params import MAX_PARAMETERS, is_default, is_name


def call_parameters(model, count: int) -> list[dict] | None:
    """[{"name"}, ..., {"name", "default"}, ...] for `model.forward` called with `count`
    positional tensors, or None where its inputs cannot be named."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    taken = params[:count]
    if len(taken) < count or any(p.kind is not p.POSITIONAL_OR_KEYWORD or not is_name(p.name)
                                 for p in taken):
        return None
    out = [{"name": p.name} for p in taken]
    for p in params[count:MAX_PARAMETERS]:
        if p.kind is not p.POSITIONAL_OR_KEYWORD or p.default is p.empty \
                or not is_default(p.default) or not is_name(p.name):
            break
        out.append({"name": p.name, "default": p.default})
    return out
