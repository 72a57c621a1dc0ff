"""An entry's call signature (manifest `entries.<name>.parameters`, format 20): the model's
own forward parameter names, so a loaded artifact binds keyword arguments as the model did.

    "parameters": [{"name": "input_ids"}, {"name": "attention_mask"},
                   {"name": "token_type_ids", "default": null}]

The list is a prefix of forward's positional parameters, in order: first one per entry input
(the same names, no default: the graph needs those tensors), then parameters the export left
at their default, each with that default, a JSON scalar (null, a boolean, a number, a string):
the plan was traced with that value, so a call may omit it or pass an equal value, nothing
else. Optional: an entry without it takes positional arguments only.
"""
from __future__ import annotations

import keyword
import math
from dataclasses import dataclass

from aotc.artifact.schema import expr as ex
from aotc.artifact.schema.fields import At

MAX_PARAMETERS = 256
MAX_DEFAULT_TEXT = 256


class _Required:
    def __repr__(self) -> str:
        return "<required>"


NO_DEFAULT = _Required()     # a parameter bound to an entry input


@dataclass(frozen=True, slots=True, kw_only=True)
class Parameter:
    name: str
    default: object = NO_DEFAULT     # None | bool | int | float | str, or NO_DEFAULT

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    def to_json(self) -> dict:
        return {"name": self.name} if self.required else {"name": self.name,
                                                          "default": self.default}


def is_name(name) -> bool:
    """A parameter name: an ASCII identifier of at most 64 characters, not a keyword."""
    return isinstance(name, str) and bool(ex.NAME_RE.match(name)) and \
        not keyword.iskeyword(name)


def is_default(value) -> bool:
    """A default the manifest can hold: null, a boolean, a finite number, a short string."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) <= ex.MAX_INT
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_DEFAULT_TEXT


def parse_parameters(a: At, inputs: tuple) -> tuple:
    """The entry's parameters, checked against its `inputs` (Input specs, in order)."""
    items = a.list(MAX_PARAMETERS, min_len=len(inputs))
    out, seen = [], set()
    for i, p in enumerate(items):
        p.obj(required=("name",), optional=("default",))
        name = p.get("name").value
        p.get("name").check(is_name(name), "a parameter name (an ASCII identifier of at most "
                            "64 characters, not a Python keyword)", "is not one")
        p.get("name").check(name not in seen, "names listed once", f"repeats {name!r}")
        seen.add(name)
        if i < len(inputs):
            p.check(not p.has("default") and name == inputs[i].name,
                    f"input #{i}'s parameter: {{\"name\": {inputs[i].name!r}}} (no default)",
                    "names another or has a default")
            out.append(Parameter(name=name))
            continue
        p.check(p.has("default"), "a default (the parameters after the inputs' are those the "
                "export left at their default)", "has none")
        value = p.get("default").value
        p.get("default").check(is_default(value), "null, a boolean, a finite number or a "
                               f"string of at most {MAX_DEFAULT_TEXT} characters", "is not")
        out.append(Parameter(name=name, default=value))
    return tuple(out)
