"""Binding a call's arguments to an entry's inputs, as Python binds them to the model's forward.

In: the entry's spec (its inputs, and the `parameters` recorded at export, format 20:
artifact/schema/params.py) and a call's positional and keyword arguments. Out: the entry's
inputs as a tuple, in order. Positionals fill the parameters in order, keywords by name; a
parameter the export left at its default may be left out or given an equal value (None for
`token_type_ids=None`), since the plan was traced with it. Everything else is a UsageError
naming the argument and the expected names; a call by position alone with too few or too
many tensors stays the guards' GuardError, as before names. An entry without recorded
parameters (formats 1-19, a forward without named inputs) takes positional arguments only.
"""
from __future__ import annotations

from aotc.errors import UsageError
from aotc.artifact.schema.params import NO_DEFAULT


def bind_arguments(spec, args: tuple, kwargs: dict, where: str) -> tuple:
    """The entry inputs of a call `where`(*args, **kwargs) of entry `spec`."""
    params = spec.parameters
    if params is None:
        if kwargs:
            raise _positional_only(spec, kwargs, where)
        return args
    if not kwargs and not len(spec.inputs) < len(args) <= len(params):
        return args      # every input by position; or a wrong count the guards report
    names = [p.name for p in params]
    if len(args) > len(params):
        raise UsageError(f"{where} takes at most {len(params)} positional arguments, "
                         f"got {len(args)}", where=where, expected=_listing(params),
                         found=f"{len(args)} positional arguments",
                         fix="pass one argument per parameter, by position or by name")
    given = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise UsageError(f"{where} got an unexpected keyword argument {key!r}",
                             where=f"{where}({key}=...)", expected=_listing(params), found=key,
                             fix=f"name one of the parameters: {', '.join(names)}")
        if key in given:
            raise UsageError(f"{where} got multiple values for argument {key!r}",
                             where=f"{where}({key}=...)", expected="each parameter once",
                             found=f"{key} by position and by name",
                             fix=f"pass {key} either by position or by name")
        given[key] = value
    missing = [p.name for p in params if p.required and p.name not in given]
    if missing:
        raise UsageError(f"{where} is missing the required argument"
                         f"{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
                         where=where, expected=_listing(params), found=sorted(given) or "none",
                         fix=f"pass {', '.join(f'{n}=...' for n in missing)}: the artifact was "
                             "exported with these inputs")
    for p in params[len(spec.inputs):]:
        if p.name in given:
            _check_default(p, given[p.name], where)
    return tuple(given[p.name] for p in params[:len(spec.inputs)])


def _check_default(p, value, where: str) -> None:
    """A parameter the export left at its default: the call may only pass that value."""
    d = p.default
    same = value is d if d is None or isinstance(d, bool) else (
        type(value) in (int, float) and value == d if isinstance(d, (int, float))
        else value == d)
    if not same:
        found = type(value).__name__ + (f" {list(value.shape)}" if hasattr(value, "shape")
                                        else f" {value!r}"[:80])
        raise UsageError(f"{where}: {p.name} was not an input of the export, which ran with "
                         f"its default {p.name}={d!r}; the artifact computes that case only",
                         where=f"{where}({p.name}=...)", expected=f"{d!r} or leaving it out",
                         found=found,
                         fix=f"omit {p.name}, or re-export with {p.name} among the example "
                             "inputs so the artifact takes it")


def _positional_only(spec, kwargs: dict, where: str) -> UsageError:
    key = next(iter(kwargs))
    names = ", ".join(i.name for i in spec.inputs)
    return UsageError(f"{where} got a keyword argument {key!r}, but this artifact records no "
                      "parameter names: it takes its inputs by position",
                      where=f"{where}({key}=...)", expected=f"positional arguments ({names})",
                      found=f"keyword arguments {sorted(kwargs)}",
                      fix="pass the inputs by position in that order, or re-export with aotc "
                          ">= format 20 from a model whose forward names its inputs")


def signature_parameters(spec, input_specs) -> str:
    """The parameter list shown by `m.signature()` and `aotc inspect`: `name: spec` for each
    input, `name=default` for the rest; `, /` where the inputs bind by position only."""
    ins = [f"{i.name}: {s}" for i, s in zip(spec.inputs, input_specs)]
    if spec.parameters is None:
        return ", ".join(ins + ["/"]) if ins else ""
    rest = [f"{p.name}={p.default!r}" for p in spec.parameters[len(spec.inputs):]]
    return ", ".join(ins + rest)


def _listing(params) -> str:
    return "(" + ", ".join(p.name if p.default is NO_DEFAULT else f"{p.name}={p.default!r}"
                           for p in params) + ")"
