"""Memory bounds for kernels run by Triton's interpreter: no launch touches memory outside the
tensors it was given.

Under the interpreter a kernel's loads and stores are raw pointer dereferences on the host
(Triton's `_interpreter.load`/`store`/`atomic_*`, in C++), so a kernel source or a launch spec
that does not match its plan (a damaged or hostile artifact: a block size larger than the one
its masks were written for, an offset past a buffer) would read or write any address of the
process. While a launch runs (`bounded_memory`), every one of those accesses first has each
address it touches (masked-off lanes excepted) checked against the launch's tensors, each from
its first element to the end of its storage: one outside refuses the launch with an
ArtifactError before the access happens, so nothing is read or corrupted. This is the
interpreter's counterpart of the extents the GPU runners check before a cubin launches.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from aotc.errors import ArtifactError
from aotc.artifact import format as fmt
from aotc.runtime.room import tensor_room


class Regions:
    """The address ranges one launch of kernel `name` may touch, sorted by start."""

    def __init__(self, name: str, args):
        spans = sorted({(t.data_ptr(), t.data_ptr() + tensor_room(t) * t.element_size())
                        for t in args if isinstance(t, torch.Tensor) and t.numel()})
        self.name = name
        self.lo = np.array([lo for lo, _ in spans], dtype=np.uint64)
        self.hi = np.array([hi for _, hi in spans], dtype=np.uint64)

    def check(self, ptrs, mask, itemsize: int, access: str) -> None:
        """Refuse unless each address of `ptrs` (where `mask` holds) and its `itemsize` bytes
        lie inside one region."""
        p = np.asarray(ptrs)
        if p.dtype != np.uint64:
            p = p.astype(np.int64).view(np.uint64)    # a negative address is a huge one
        if mask is not None:
            p = p[np.broadcast_to(np.asarray(mask, dtype=bool), p.shape)]
        if p.size == 0:
            return
        size = np.uint64(itemsize)
        first, last = p.min(), p.max()
        i = int(np.searchsorted(self.lo, first, side="right")) - 1
        if i >= 0 and last <= self.hi[i] - size:          # all inside one tensor (the usual)
            return
        at = np.searchsorted(self.lo, p, side="right").astype(np.int64) - 1
        inside = (at >= 0) & (p <= self.hi[np.maximum(at, 0)] - size) if self.lo.size \
            else np.zeros(p.shape, dtype=bool)
        if inside.all():
            return
        bad = p[~inside]
        raise ArtifactError(
            f"kernel {self.name} {access} memory outside the tensors it was launched with",
            where=fmt.triton_source_file(self.name),
            expected=f"addresses inside its {len(self.lo)} tensor arguments",
            found=f"{bad.size} of {p.size} addresses outside, the first {hex(int(bad[0]))}",
            fix="re-export the artifact (its kernel sources or launch specs do not match its "
                "plans)")


class _Bounded:
    """Triton's interpreter library with its memory accesses checked against `regions`."""

    def __init__(self, real, regions: Regions):
        self._real, self._regions = real, regions

    def __getattr__(self, attr):
        return getattr(self._real, attr)

    def load(self, ptrs, mask, other, dtype):
        self._regions.check(ptrs, mask, np.dtype(dtype).itemsize, "reads")
        return self._real.load(ptrs, mask, other, dtype)

    def store(self, ptrs, value, mask):
        self._regions.check(ptrs, mask, np.asarray(value).itemsize, "writes")
        return self._real.store(ptrs, value, mask)

    def atomic_rmw(self, op, ptrs, value, mask, sem):
        self._regions.check(ptrs, mask, np.asarray(value).itemsize, "updates")
        return self._real.atomic_rmw(op, ptrs, value, mask, sem)

    def atomic_cas(self, ptrs, cmp, value, sem):
        self._regions.check(ptrs, None, np.asarray(value).itemsize, "updates")
        return self._real.atomic_cas(ptrs, cmp, value, sem)


@contextlib.contextmanager
def bounded_memory(name: str, args):
    """While active (one launch, under the interpreter's launch lock), the interpreter's memory
    accesses are checked against the tensors of `args`; an interpreter laid out otherwise (no
    library to guard) is refused rather than run unchecked."""
    from triton.runtime import interpreter as ti
    real = getattr(ti, "_interpreter", None)
    if real is None or not all(hasattr(real, f) for f in ("load", "store")):
        raise ArtifactError("Triton's interpreter is laid out otherwise than aotc knows",
                            where=fmt.triton_source_file(name),
                            expected="triton.runtime.interpreter._interpreter with load/store",
                            found=f"triton {getattr(ti.triton, '__version__', '?')}",
                            fix="install triton >= 3.6, < 3.10")
    ti._interpreter = _Bounded(real, Regions(name, args))
    try:
        yield
    finally:
        ti._interpreter = real
