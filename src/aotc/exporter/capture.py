"""Capture: `torch.export` (Dynamo bytecode capture, fullgraph) and the translation of its failures
into `ExportError`s that quote the user's source line, say why, and suggest a fix.
"""
from __future__ import annotations

import contextlib
import io
import linecache
import logging
import re
import sysconfig
import threading
import traceback
import warnings
from pathlib import Path

import torch

from aotc.errors import ExportError

# (pattern in the failure text, suggested fix), first match wins: a data-dependent size
# ("Could not extract specialized integer from data-dependent expression u0") is not a
# dynamic dim narrowed by the code.
_FIXES = (
    (r"data.dependent|GuardOnDataDependent|generic_jump|Dynamic control flow",
     "a size or branch there depends on tensor values (NMS, nonzero, boolean indexing): "
     "export the part of the model before it (a detector's backbone and head) and run that "
     "post-processing eagerly on its outputs; or state the size's bounds with "
     "torch._check(...) before that line; for a branch on values use torch.where, or "
     "torch.cond for real branches"),
    (r"Constraints violated|specializ|not in range|ConstraintViolation",
     "the model's code fixes or narrows a dynamic dim (see the line above); widen the code "
     "path, narrow the declared range to what the error suggests, or make the dim static"),
    (r"\.item\(\)|Tensor\.item|tolist|_local_scalar_dense",
     "keep values as tensors instead of turning them into Python numbers"),
    (r"\bprint\b|logging|logger", "remove print and logging calls from forward"),
    (r"numpy|np\.", "use torch operations instead of NumPy inside forward"),
    (r"Unsupported|graph break", "rewrite this line with tensor operations, or export with "
                                 "--no-strict to trace it with Python instead of Dynamo"),
)
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


_AOTC = Path(__file__).parents[1]
_LIBRARY_DIRS = tuple({sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib",
                                                        "platlib")}
                      | {str(_AOTC / stage) for stage in ("exporter", "codegen", "runtime", "cli")})


def _is_library(path: str) -> bool:
    return path.startswith("<") or path.startswith(_LIBRARY_DIRS) or "site-packages" in path


def locate(exc: BaseException, source: Path | None) -> str | None:
    """file:line: code of the user's line that failed, found in the message or the traceback."""
    texts = [str(exc), "".join(traceback.format_exception(exc))]
    frames = [(f, int(n)) for text in texts for f, n in _FRAME.findall(text)]
    mine = [fr for fr in frames if source is not None
            and Path(fr[0]).resolve() == source.resolve()]
    frames = mine or [fr for fr in frames if not _is_library(fr[0])]
    if not frames:
        return None
    file, line = frames[-1]
    code = linecache.getline(file, line).strip()
    return f"{file}:{line}: {code}"


_USER_STACK = re.compile(r"(?:User Stack \(most recent call last\):|from user code:)\n(.*?)"
                         r"(?:\n\n|\Z)", re.S)
_REASONS = ("Could not guard on data-dependent", "Could not extract specialized integer",
            "Unsupported", "Constraints violated")


def cause(exc: BaseException) -> str | None:
    """Where torch says the capture failed: the innermost frame of the user stack its message
    quotes, a library's line too (torchvision's `batched_nms`), followed by the innermost
    line of the model's own code that led there. None if the message quotes no stack."""
    block = _USER_STACK.search(str(exc))
    frames = [(f, int(n)) for f, n in _FRAME.findall(block.group(1))] if block else []
    if not frames:
        return None
    at = lambda fr: f"{fr[0]}:{fr[1]}: {linecache.getline(fr[0], fr[1]).strip()}"  # noqa: E731
    mine = [fr for fr in frames if not _is_library(fr[0])]
    where = at(frames[-1])
    if mine and mine[-1] != frames[-1]:
        where += f" (called from {at(mine[-1])})"
    return where


def reason(text: str, default: str) -> str:
    """The line of torch's message that says why (its first line is often advice)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for key in _REASONS:
        for ln in lines:
            if key in ln:
                return ln[ln.index(key):]
    return lines[0] if lines else default


def suggest(text: str) -> str:
    for pattern, fix in _FIXES:
        if re.search(pattern, text):
            return fix
    return "simplify the model's forward at this line, or export with --no-strict"


def capture(module: torch.nn.Module, args: tuple, *, strict: bool, source: Path | None,
            dynamic_shapes=None, notes: list | None = None):
    """The model's ExportedProgram. Strict capture (Dynamo) first; where Dynamo cannot follow
    a Python construct it does not support (`Unsupported`: an autograd.Function it cannot
    trace, a `register_buffer` in forward, `requires_grad_()` on an intermediate) or a value it
    made data-dependent by tracing Python-side code (NumPy's random numbers), the forward
    is traced with Python instead (torch.export's non-strict mode: the same ATen graph, the
    Python run once at export), and `notes` gets a line saying so and why. An ExportError
    names the line where capture failed otherwise (or where both failed)."""
    try:
        with parameters_shared(), quiet():
            return torch.export.export(module, args, strict=strict, dynamic_shapes=dynamic_shapes)
    except Exception as e:   # torch raises many unrelated classes here
        text = str(e)
        why = reason(text, type(e).__name__)
        if strict and _dynamo_limit(e):
            try:
                with quiet():
                    ep = torch.export.export(module, args, strict=False,
                                             dynamic_shapes=dynamic_shapes)
            except Exception:   # noqa: BLE001 - the strict failure says more: raised below
                pass
            else:
                if notes is not None:
                    at = cause(e) or locate(e, source) or "model forward"
                    notes.append(f"traced with Python (non-strict), as Dynamo cannot capture "
                                 f"it: {why} (at {at})"[:256])
                return ep
        raise ExportError(f"capturing the model as one graph failed: {why[:400]}",
                          where=cause(e) or locate(e, source) or "model forward",
                          expected="a forward pass torch.export can capture without graph breaks",
                          found=type(e).__name__, fix=suggest(text)) from e


# torch warns of this on every transformers model (their output-capturing hooks write a
# module global); the capture is correct, and the warning names nothing the user can change
_SIDE_EFFECTS = r"While compiling, we found certain side effects happened"


@contextlib.contextmanager
def quiet():
    """torch's own output while it captures (graph dumps printed on a data-dependent branch,
    symbolic-shape warnings, the side-effects warning): kept out of the user's terminal, as the
    ExportError raised after says what failed. The `aotc` logger at DEBUG (`aotc --debug`)
    lets everything but the side-effects warning through."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SIDE_EFFECTS)
        if logging.getLogger("aotc").isEnabledFor(logging.DEBUG):
            yield
            return
        disabled = logging.root.manager.disable
        sink = io.StringIO()
        logging.disable(logging.WARNING)
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            logging.disable(disabled)


_SHARING = threading.Lock()
_SHARERS = [0]     # captures in flight that share parameters (the patch is one, process-wide)


@contextlib.contextmanager
def parameters_shared():
    """While Dynamo captures: the model's parameters are not copied.

    For export, Dynamo keeps a real-valued twin of every tensor it meets (its
    `real_value_cache`, filled through `clone_input` in torch._dynamo.variables.builder),
    read only where tracing asks for a concrete value (a branch on a constant tensor, a
    function marked assume-constant). Twins of the parameters are a second copy of the model
    held until the capture ends, and clone_input's own temporary is a third: exporting a
    generator of 1.7 GB of bf16 weights peaked at 6.9-8.6 GB of host memory (two captures),
    four to five times the weights, which a 7B model's export cannot have on most hosts.
    Parameters are not written by an inference forward, so the twin can be the parameter
    itself: the peak stays at the model plus what the capture needs itself. Buffers (a KV
    cache the forward updates in place) are still copied. Where torch's Dynamo has no such
    function, capture copies as before."""
    builder = _dynamo_builder()
    if builder is None:
        yield
        return
    with _SHARING:
        if _SHARERS[0] == 0:
            builder.clone_input = _keep_parameters(builder.clone_input)
        _SHARERS[0] += 1
    try:
        yield
    finally:
        with _SHARING:
            _SHARERS[0] -= 1
            if _SHARERS[0] == 0:
                builder.clone_input = builder.clone_input.__wrapped__


def _dynamo_builder():
    """torch._dynamo.variables.builder where it copies through a module-level `clone_input`."""
    try:
        from torch._dynamo.variables import builder
    except ImportError:
        return None
    return builder if callable(getattr(builder, "clone_input", None)) else None


def _keep_parameters(clone):
    def clone_input(x, *args, **kwargs):
        return x if isinstance(x, torch.nn.Parameter) else clone(x, *args, **kwargs)
    clone_input.__wrapped__ = clone
    return clone_input


def captured(notes: list[str]) -> dict:
    """The manifest option saying how the graph was captured, where not as asked."""
    return {"capture": notes[0]} if notes else {}


def _dynamo_limit(e: BaseException) -> bool:
    """A failure of Dynamo's (its own exceptions: a construct it does not follow, or a value it
    made data-dependent by tracing Python-side code such as NumPy's random numbers, which a
    Python trace runs as plain numbers); not a dynamic-shape constraint, which Python tracing
    cannot get past either."""
    from torch._dynamo import exc
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    kinds = tuple(getattr(exc, k) for k in ("Unsupported", "UserError", "TorchRuntimeError")
                  if hasattr(exc, k)) + (GuardOnDataDependentSymNode,)
    return isinstance(e, kinds) and not re.search(r"Constraints violated", str(e))
