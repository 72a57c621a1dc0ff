"""Running a CUDA artifact's Triton kernels on the CPU with Triton's interpreter: a testing aid.

`aotc.load(path, device="cpu", interpret=True)` runs each kernel's source (kernels/<name>.py,
the very text its cubins were compiled from, as the artifact verified it, from memory, after
runtime/kernelsource.py checked it is a Triton kernel and nothing else) with Triton's
interpreter switched on, and launches it on CPU tensors. It is slow (launches run one at a time: the interpreter patches
`triton.language` while it runs), and meant for tests and CI on machines without a GPU; it is
the only part of the runtime that imports Triton.

Triton reads TRITON_INTERPRET when a `@triton.jit` decorator runs, so the variable is set only
while kernel sources are imported, under a lock, and restored right after: nothing else in the
process (nor any subprocess started later) sees it. Functions that Triton's interpreter lacks
(`libdevice.*`) are bound, in each imported kernel module, to NumPy stand-ins (`_libdevice`),
and its `tl.dot` of bf16 blocks, which multiplies their raw bits, is mended while launches run
(`bf16_dots`).
"""
from __future__ import annotations

import contextlib
import hashlib
import linecache
import os
import threading
import types
from types import SimpleNamespace

import torch

from aotc.errors import ArtifactError
from aotc.runtime import format as fmt
from aotc.runtime.kernels import TritonKernels
from aotc.runtime.kernelsource import check_kernel_source

_env_lock = threading.RLock()
_launch_lock = threading.Lock()


@contextlib.contextmanager
def interpreter_env(on: bool):
    """TRITON_INTERPRET set to `on` for the duration (kernel imports), then restored."""
    with _env_lock:
        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if on else "0"
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = old


def _numpy_function(np_fn):
    """A libdevice stand-in: applies `np_fn` to the NumPy data of interpreter tensors."""
    def call(*args):
        import numpy as np
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle
        ref = next(a for a in args if isinstance(a, tl.core.tensor))
        np_dtype = ref.handle.data.dtype
        data = [a.handle.data if isinstance(a, tl.core.tensor) else np.asarray(a, np_dtype)
                for a in args]
        with np.errstate(all="ignore"):
            out = np.asarray(np_fn(*data)).astype(np_dtype)
        scalar = ref.dtype
        ty = tl.block_type(scalar, list(out.shape)) if out.shape else scalar
        return tl.core.tensor(TensorHandle(out, scalar), ty)
    return call


def _libdevice():
    import numpy as np
    names = {"tanh": np.tanh, "expm1": np.expm1, "log1p": np.log1p, "log10": np.log10,
             "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
             "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
             "atanh": np.arctanh, "atan2": np.arctan2, "copysign": np.copysign,
             "hypot": np.hypot, "nearbyint": np.rint, "trunc": np.trunc, "pow": np.power}
    return SimpleNamespace(**{k: _numpy_function(f) for k, f in names.items()})


@contextlib.contextmanager
def bf16_dots():
    """Triton's interpreter (3.6 to 3.9 at least) holds bf16 blocks as their raw uint16 bits
    and multiplies those in `tl.dot`: garbage. While this is active (launches, under
    `_launch_lock`), its dot widens bf16 operands to float32 first, which is exact; the
    builder is restored after."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as ti
    cls = ti.InterpreterBuilder
    original = getattr(cls, "create_dot", None)
    if original is None:       # a Triton whose interpreter is laid out otherwise
        yield
        return

    def widened(h):
        if h.dtype == tl.bfloat16:
            return ti.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32),
                                   tl.float32)
        return h

    def create_dot(self, a, b, d, *rest):
        return original(self, widened(a), widened(b), d, *rest)
    cls.create_dot = create_dot
    try:
        yield
    finally:
        cls.create_dot = original


def import_kernel(text: str, name: str, where: str):
    """Run the verified source of kernels/<name>.py (its bytes as the artifact read them, after
    `check_kernel_source`) with the interpreter on, from memory: nothing is read from or
    written to the artifact (no .pyc); returns its `@triton.jit` function. Triton itself is
    imported first, with the interpreter off, so that its own library stays compiled for anyone
    else in the process (generated kernels never call into it)."""
    import triton  # noqa: F401
    import triton.language  # noqa: F401
    check_kernel_source(text, where)
    filename = f"<aotc kernel {name} {hashlib.sha256(text.encode()).hexdigest()[:12]}>"
    lines = text.splitlines(keepends=True)
    linecache.cache[filename] = (len(text), None, lines, filename)   # Triton reads its source
    module = types.ModuleType(f"aotc_interpreted_{name}")
    module.__file__ = filename
    with interpreter_env(True):
        exec(compile(text, filename, "exec"), module.__dict__)  # noqa: S102 - checked above
    module.libdevice = _libdevice()
    fn = module.__dict__.get(name)
    if fn is None:
        raise ArtifactError(f"{where} does not define kernel {name}", where=where,
                            expected=f"a @triton.jit function {name}", found="none",
                            fix="re-export the model")
    return fn


class InterpretedKernels(TritonKernels):
    """An artifact's Triton kernels run by Triton's interpreter on CPU tensors."""

    takes_tensors = True

    def __init__(self, artifact, native, device: torch.device):
        super().__init__(artifact, native, torch.device("cpu"))
        self.functions = {}
        for name in self.specs:
            rel = fmt.triton_source_file(name)
            self.functions[name] = import_kernel(artifact.read(rel).decode("utf-8", "replace"),
                                                 name, artifact.where(rel))

    def kernel(self, name: str, nargs: int, nsizes: int, dtypes: list[str]):
        self.check_step(name, nargs, nsizes, dtypes)
        spec, fn = self.spec(name), self.functions[name]
        constexprs = dict(spec.constexprs)

        def launch(grid, *args):
            import numpy as np
            if grid[0] * grid[1] * grid[2]:
                # the interpreter patches triton.language while it runs: one launch at a time;
                # masked-out lanes compute on zeros, so NumPy's warnings mean nothing
                with _launch_lock, np.errstate(all="ignore"), bf16_dots():
                    fn[tuple(grid)](*args, **constexprs)
            return 0
        return launch
