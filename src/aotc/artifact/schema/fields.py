"""Reading JSON documents of an artifact field by field, with errors that name the field.

`load_json(data, file)` parses bytes (bounded size, no NaN/Infinity, no duplicate keys, nesting
within the interpreter's limit) into an `At`: a value with the document and the path that led
to it. Each accessor checks the value's type and range and returns a plain Python value; any
mismatch raises `ArtifactError` naming the file, the field (`steps[3].args[0]`), what was
expected, what was found, and a fix. The schema's parsers (manifest.py, plan.py, launch.py) are
written entirely in these accessors, so nothing of a document is used unchecked.
"""
from __future__ import annotations

import json
import re
import sys
from enum import Enum
from functools import lru_cache
from typing import NoReturn

from aotc.errors import ArtifactError
from aotc.artifact.schema import expr as ex

MAX_JSON_BYTES = 256 << 20     # one manifest, plan or launch spec
MAX_STR = 4096                 # characters in one string field
MAX_LIST = 1 << 20             # items in one list
MAX_DEPTH = 64                 # nesting of the recursive structures (output trees)
FIX = ("re-export the model with this aotc; the artifact is damaged or was not written by "
       "aotc")
_MISSING = object()
ASCII_PRINTABLE = re.compile(r"[\x20-\x7e]*\Z")


@lru_cache(maxsize=8192)
def _parse(text: str, symbols, boolean: bool):
    """Parsed expressions are immutable: the same text over the same symbols parses once."""
    return (ex.parse_relation if boolean else ex.parse_size)(text, symbols)


def short(value, limit: int = 80) -> str:
    """A value from an artifact as both front ends quote it (the C++ front end's json::dump):
    compact JSON, non-ASCII kept, cut to `limit` characters."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):   # not JSON (bytes, NaN): Python's own form
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _constant(name):
    raise ValueError(f"{name} is not a JSON number")


def load_json(data: bytes, file: str) -> "At":
    """Parse one JSON document of an artifact."""
    if len(data) > MAX_JSON_BYTES:
        raise ArtifactError(f"{file} is larger than aotc reads", where=file,
                            expected=f"at most {MAX_JSON_BYTES} bytes", found=len(data), fix=FIX)
    if sys.getrecursionlimit() > 20000 and _depth(data) > 1000:
        raise ArtifactError(f"{file} is nested too deeply", where=file,
                            expected="JSON nested at most 1000 levels", found="deeper", fix=FIX)
    try:
        value = json.loads(data, object_pairs_hook=_pairs, parse_constant=_constant)
    except RecursionError:
        raise ArtifactError(f"{file} is nested too deeply", where=file,
                            expected="JSON nested within the interpreter's limit",
                            found="deeper nesting", fix=FIX) from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ArtifactError(f"{file} is not valid JSON ({short(str(e), 200)})", where=file,
                            expected="a JSON document", found=f"{len(data)} bytes that do not "
                            "parse", fix=FIX) from None
    return At.root(file, value)


def _depth(data: bytes) -> int:
    """Nesting depth of a JSON text (strings skipped), for interpreters whose recursion limit
    was raised so high that the parser itself could exhaust the C stack."""
    depth = deepest = 0
    for m in re.finditer(rb'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', data):
        c = m.group()[:1]
        if c in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


class At:
    """A JSON value in `file`, reached from `parent` by `key` (its path is built only when an
    error names it)."""

    __slots__ = ("file", "parent", "key", "value")

    def __init__(self, file: str, parent, key, value):
        self.file, self.parent, self.key, self.value = file, parent, key, value

    @classmethod
    def root(cls, file: str, value) -> "At":
        """A whole document (already parsed JSON)."""
        return cls(file, None, None, value)

    @property
    def path(self) -> str:
        if self.parent is None:
            return self.key or ""
        base = self.parent.path
        if isinstance(self.key, int):
            return f"{base}[{self.key}]"
        return f"{base}.{self.key}" if base else str(self.key)

    # ------------------------------------------------------------------------------ errors
    def fail(self, expected, found=_MISSING, problem: str | None = None) -> NoReturn:
        found = short(self.value) if found is _MISSING else found
        field = self.path or "the document"
        raise ArtifactError(f"{self.file}: {field} {problem or 'is malformed'}",
                            where=f"{self.file}, field {field}", expected=expected,
                            found=found, fix=FIX)

    def check(self, ok: bool, expected, problem: str | None = None) -> None:
        if not ok:
            self.fail(expected, problem=problem)

    # --------------------------------------------------------------------------- structure
    def child(self, key, value) -> "At":
        return At(self.file, self, key, value)

    def obj(self, required=(), optional=()) -> "At":
        """Check that this is an object with every `required` key and no key outside
        `required` and `optional`."""
        if not isinstance(self.value, dict):
            self.fail("a JSON object", problem="is not an object")
        for k in required:
            if k not in self.value:
                self.child(k, None).fail(f"a field {short(k)}", found="nothing",
                                          problem="is missing")
        allowed = set(required) | set(optional)
        extra = sorted(k for k in self.value if k not in allowed)
        if extra:
            self.child(extra[0], self.value[extra[0]]).fail(
                f"only the fields {short(sorted(allowed), 1 << 20)}", found=short(extra[0]),
                problem="is not a field of this format")
        return self

    def get(self, key: str, default=_MISSING) -> "At":
        if not isinstance(self.value, dict):
            self.fail("a JSON object", problem="is not an object")
        if key not in self.value:
            if default is not _MISSING:
                return At(self.file, self, key, default)
            self.child(key, None).fail(f"a field {short(key)}", found="nothing",
                                        problem="is missing")
        return self.child(key, self.value[key])

    def has(self, key: str) -> bool:
        return isinstance(self.value, dict) and key in self.value

    def list(self, max_len: int = MAX_LIST, min_len: int = 0) -> list["At"]:
        if not isinstance(self.value, list):
            self.fail("a JSON list", problem="is not a list")
        if not min_len <= len(self.value) <= max_len:
            self.fail(f"a list of {min_len}..{max_len} items", found=f"{len(self.value)} items")
        return [self.child(i, v) for i, v in enumerate(self.value)]

    def items(self, max_len: int = MAX_LIST) -> list[tuple[str, "At"]]:
        if not isinstance(self.value, dict):
            self.fail("a JSON object", problem="is not an object")
        if len(self.value) > max_len:
            self.fail(f"at most {max_len} entries", found=f"{len(self.value)} entries")
        return [(k, self.child(k, v)) for k, v in self.value.items()]

    # ------------------------------------------------ fields of this object, checked in place
    # (the common case builds no cursor: one is made only to name a field that fails)
    def int_of(self, key: str, lo: int = 0, hi: int = ex.MAX_INT) -> int:
        v = self.value.get(key, _MISSING) if type(self.value) is dict else _MISSING
        if type(v) is int and lo <= v <= hi:
            return v
        return self.get(key).int(lo, hi)

    def str_of(self, key: str, choices) -> str:
        v = self.value.get(key, _MISSING) if type(self.value) is dict else _MISSING
        if type(v) is str and v in choices:
            return v
        return self.get(key).str(choices=choices)

    def bool_of(self, key: str) -> bool:
        v = self.value.get(key, _MISSING) if type(self.value) is dict else _MISSING
        return v if type(v) is bool else self.get(key).bool()

    def sizes_of(self, key: str, symbols, max_len: int = 16) -> tuple:
        v = self.value.get(key, _MISSING) if type(self.value) is dict else _MISSING
        if type(v) is list and len(v) <= max_len and \
                all(type(d) is int and 0 <= d <= 1 << 48 for d in v):
            return tuple(v)
        return tuple(d.size(symbols) for d in self.get(key).list(max_len))

    def ints_of(self, key: str, hi: int, default=_MISSING, nullable: bool = False) -> tuple:
        """A list of integers in [0, hi] (None items too, where `nullable`)."""
        v = self.value.get(key, default) if type(self.value) is dict else _MISSING
        if type(v) is list and len(v) <= 1 << 16 and all(
                (type(x) is int and 0 <= x <= hi) or (nullable and x is None) for x in v):
            return tuple(v)
        return tuple(None if (nullable and x.is_null()) else x.int(0, hi)
                     for x in self.get(key, default).list(1 << 16))

    def keys_within(self, required, allowed) -> "At":
        """obj(), with a quick path for an object whose keys are in order."""
        v = self.value
        if type(v) is dict and v.keys() <= allowed and all(k in v for k in required):
            return self
        return self.obj(required, allowed)

    # ------------------------------------------------------------------------------ scalars
    def is_null(self) -> bool:
        return self.value is None

    def int(self, lo: int = 0, hi: int = ex.MAX_INT) -> int:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(f"an integer in [{lo}, {hi}]", problem="is not an integer")
        if not lo <= v <= hi:
            self.fail(f"an integer in [{lo}, {hi}]", problem="is out of range")
        return v

    def number(self) -> float | int:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.fail("a number", problem="is not a number")
        return v

    def bool(self) -> bool:
        if not isinstance(self.value, bool):
            self.fail("true or false", problem="is not a boolean")
        return self.value

    def str(self, *, pattern: re.Pattern | None = None, max_len: int = MAX_STR,
            choices=None) -> str:
        v = self.value
        if not isinstance(v, str):
            self.fail("a string", problem="is not a string")
        if len(v) > max_len:
            self.fail(f"a string of at most {max_len} characters",
                      found=f"{len(v)} characters")
        if choices is not None and v not in choices:
            self.fail(f"one of {short(sorted(choices), 1 << 20)}", problem="is not a known value")
        if pattern is not None and not pattern.match(v):
            self.fail(f"a string matching {pattern.pattern}", problem="is not well formed")
        return v

    def text(self, max_len: int = MAX_STR) -> str:
        """A string shown to people only (names, versions): printable ASCII."""
        return self.str(pattern=ASCII_PRINTABLE, max_len=max_len)

    def ident(self) -> str:
        """An ASCII identifier (symbol, kernel, argument names)."""
        return self.str(pattern=ex.NAME_RE, max_len=64)

    def enum(self, kind: type[Enum]):
        try:
            return kind(self.value)
        except (ValueError, TypeError):
            self.fail(f"one of {short([e.value for e in kind], 1 << 20)}",
                      problem="is not a known value")

    def expr(self, symbols, *, boolean: bool = False):
        """A size expression (or, with `boolean`, a relation) over the declared `symbols`."""
        if not isinstance(self.value, str):
            self.fail("an expression string", problem="is not a string")
        try:
            return _parse(self.value, None if symbols is None else frozenset(symbols), boolean)
        except ex.ExprError as e:
            self.fail("integer arithmetic (+ - * // % min max) over declared symbols",
                      problem=f"is not a valid size expression ({e})")

    def size(self, symbols, hi: int = 1 << 48):
        """A size: an integer in [0, hi], or an expression over declared symbols."""
        if isinstance(self.value, str):
            return self.expr(symbols)
        return self.int(0, hi)
