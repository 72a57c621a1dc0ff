"""Loading `model.py:Name`: a module class or a factory function, from a file, in its own namespace
(or `package.module:factory`, imported from sys.path as Python imports it).

The file is imported under a private, unique module name (so two models named `model.py` never
collide and nothing the file defines leaks into aotc), with its folder on `sys.path` only while it
is imported, so it may import its siblings.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import re
import sys
import traceback
from pathlib import Path

import torch

from aotc.errors import ExportError, UsageError


MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def split_ref(ref: str) -> tuple[Path | str, str]:
    """(file, name) of `FILE.py:Name`, or (module name, name) of `package.module:factory`."""
    path, sep, name = ref.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise UsageError(f"malformed model reference {ref!r}", where="MODEL argument",
                         expected="FILE.py:Name, package.module:factory or a model folder",
                         found=ref,
                         fix="name a Python file and a class or function in it, e.g. "
                             "samples/mlp.py:Net, or a folder written by save_pretrained")
    if MODULE.match(path) and not path.endswith(".py") and not Path(path).exists():
        return path, name
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"model file {path} does not exist", where="MODEL argument",
                         expected="an existing .py file", found=path,
                         fix="check the path (it is relative to the current directory)")
    if p.suffix != ".py":
        raise UsageError(f"model file {path} is not a Python file", where="MODEL argument",
                         expected="a .py file", found=p.suffix or "no suffix",
                         fix="point at the .py file that defines the model")
    return p, name


def user_frame(exc: BaseException, file: Path) -> str | None:
    """`file:line: source` of the deepest traceback frame inside the user's file."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == file.resolve():
            found = f"{file}:{frame.lineno}: {(frame.line or '').strip()}"
    return found


def import_file(path: Path):
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    modname = f"aotc_user_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[modname] = module   # dataclasses and typing need the module registered
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(modname, None)
        raise ExportError(f"importing {path} failed: {type(e).__name__}: {e}",
                          where=user_frame(e, path) or str(path), expected="a file that imports",
                          found=f"{type(e).__name__}", fix="fix the error in the model file; "
                          "run `python FILE.py` to reproduce it") from e
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def parse_init_args(text: str | None):
    if text is None:
        return (), {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--init-args is not valid JSON ({e})", where="--init-args",
                         expected='a JSON object or array, e.g. \'{"hidden": 64}\'', found=text,
                         fix="quote the JSON for your shell") from None
    if isinstance(value, dict):
        return (), value
    if isinstance(value, list):
        return tuple(value), {}
    raise UsageError("--init-args must be a JSON object or array", where="--init-args",
                     expected="{...} or [...]", found=type(value).__name__,
                     fix='pass keyword arguments as an object: \'{"hidden": 64}\'')


def import_module(name: str):
    """`package.module` of `package.module:factory`, imported from sys.path."""
    try:
        return importlib.import_module(name)
    except Exception as e:
        raise ExportError(f"importing {name} failed: {type(e).__name__}: {e}", where=name,
                          expected="a module importable from sys.path", found=type(e).__name__,
                          fix=f"check `python -c 'import {name}'` works (install the package "
                              "or run from its folder)") from e


def load_model(ref: str, init_args: str | None = None) -> torch.nn.Module:
    path, name = split_ref(ref)
    args, kwargs = parse_init_args(init_args)
    module = import_file(path) if isinstance(path, Path) else import_module(path)
    obj = getattr(module, name, None)
    if obj is None:
        candidates = sorted(k for k, v in vars(module).items() if not k.startswith("_") and (
            (inspect.isclass(v) and issubclass(v, torch.nn.Module)) or inspect.isfunction(v))
            and getattr(v, "__module__", None) == module.__name__)
        raise UsageError(f"{path} defines no {name!r}", where=f"{path}:{name}",
                         expected="an nn.Module subclass or a function returning a module",
                         found=f"available: {', '.join(candidates) or 'none'}",
                         fix=f"use one of {path}:{candidates[0]}" if candidates else
                             "define the model class in that file")
    if not (inspect.isclass(obj) and issubclass(obj, torch.nn.Module)) and not callable(obj):
        raise UsageError(f"{path}:{name} is neither an nn.Module class nor a function",
                         where=f"{path}:{name}", expected="nn.Module subclass or factory",
                         found=type(obj).__name__, fix="point at the model class")
    try:
        model = obj(*args, **kwargs)
    except Exception as e:
        raise ExportError(f"constructing {path}:{name} failed: {type(e).__name__}: {e}",
                          where=(user_frame(e, path) if isinstance(path, Path) else None)
                          or f"{path}:{name}",
                          expected="a model built from --init-args", found=type(e).__name__,
                          fix="pass the constructor's arguments with --init-args '<json>'") from e
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"{path}:{name}() returned {type(model).__name__}, not an nn.Module",
                          where=f"{path}:{name}", expected="torch.nn.Module",
                          found=type(model).__name__, fix="return the model from the function")
    return model
