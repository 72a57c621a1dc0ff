"""Running a CUDA artifact's Triton kernels on the CPU with Triton's interpreter: a testing aid.

`aotc.load(path, device="cpu", interpret=True)` runs each kernel's source (kernels/<name>.py,
the very text its cubins were compiled from, as the artifact verified it, from memory, after
runtime/kernelsource.py checked it is a Triton kernel and nothing else) with Triton's
interpreter switched on, and launches it on CPU tensors. It is slow (launches run one at a
time: the interpreter patches `triton.language` while it runs), and meant for tests and CI on
machines without a GPU; it is the only part of the runtime that imports Triton.

Triton reads TRITON_INTERPRET when a `@triton.jit` decorator runs, so the variable is set only
while kernel sources are imported, under a lock, and restored right after: nothing else in the
process (nor any subprocess started later) sees it. Functions that Triton's interpreter lacks
(`libdevice.*`) are bound, in each imported kernel module, to NumPy stand-ins (`_libdevice`),
and its bf16 arithmetic, which takes bf16 blocks' raw bits for values in `tl.dot` and in casts,
is mended while launches run (`mended_bf16`). Each launch's loads and stores are bounded to the
tensors it was given (runtime/memguard.py): a kernel that does not match its plan is refused
before it touches memory outside them.
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
from aotc.artifact import format as fmt
from aotc.runtime.kernels import TritonKernels
from aotc.runtime.kernelsource import check_kernel_source
from aotc.runtime.memguard import bounded_memory

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


def _interpreted(name: str, fn, grid, args, constexprs) -> None:
    """One launch through the interpreter; what fails in the kernel (a block size its source
    cannot take, an argument it does not have) is an ArtifactError naming it."""
    try:
        fn[tuple(grid)](*args, **constexprs)
    except ArtifactError:
        raise
    except Exception as e:   # noqa: BLE001 - the interpreter's errors are of any type
        if isinstance(e.__cause__, ArtifactError):   # ours (bounded_memory), wrapped by Triton
            raise e.__cause__ from None
        raise ArtifactError(f"kernel {name} failed in Triton's interpreter",
                            where=fmt.triton_source_file(name),
                            expected="a kernel that runs with its launch spec's blocks and "
                                     "the plan's arguments",
                            found=f"{type(e).__name__}: {e}"[:300],
                            fix="re-export the artifact (interpret=True is for artifacts you "
                                "trust)") from e


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


def _bf16_to_f32(data):
    import numpy as np
    return (np.asarray(data).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(f32):
    """Round to nearest even, as the GPU's conversion does; NaNs stay NaNs."""
    import numpy as np
    f32 = np.ascontiguousarray(f32, dtype=np.float32)
    bits = f32.view(np.uint32)
    out = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(f32)
    out[nan] = ((bits[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return out


@contextlib.contextmanager
def mended_bf16():
    """Triton's interpreter (3.6 to 3.9 at least) holds bf16 blocks as their raw uint16 bits,
    and two of its operations take those bits for values: `tl.dot` multiplies them (garbage),
    and a cast to bf16 truncates float32's bits instead of rounding them (and casts other
    types' values as if they were bits). While this is active (launches, under
    `_launch_lock`), its dot widens bf16 operands to float32 first, which is exact, and casts
    to and from bf16 go through float32 with round-to-nearest-even, as on a GPU; the builder is
    restored after."""
    import triton.language as tl
    from triton.runtime import interpreter as ti
    cls = ti.InterpreterBuilder
    dot, cast = getattr(cls, "create_dot", None), getattr(cls, "cast_impl", None)
    np_dtype = getattr(ti, "_get_np_dtype", None)
    if dot is None or cast is None or np_dtype is None:   # an interpreter laid out otherwise
        yield
        return

    def widened(h):
        return ti.TensorHandle(_bf16_to_f32(h.data), tl.float32) if h.dtype == tl.bfloat16 \
            else h

    def create_dot(self, a, b, d, *rest):
        return dot(self, widened(a), widened(b), d, *rest)

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s != d and d == tl.bfloat16:
            f32 = _bf16_to_f32(src.data) if s == tl.bfloat16 else src.data.astype("float32")
            return ti.TensorHandle(_f32_to_bf16(f32), d)
        if s != d and s == tl.bfloat16:
            return ti.TensorHandle(_bf16_to_f32(src.data).astype(np_dtype(dst_type)), d)
        return cast(self, src, dst_type)
    cls.create_dot, cls.cast_impl = create_dot, cast_impl
    try:
        yield
    finally:
        cls.create_dot, cls.cast_impl = dot, cast


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
                with _launch_lock, np.errstate(all="ignore"), mended_bf16(), \
                        bounded_memory(name, args):
                    _interpreted(name, fn, grid, args, constexprs)
            return 0
        return launch
