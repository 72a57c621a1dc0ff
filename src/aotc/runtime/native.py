"""The native kernel library of a CPU artifact: ISA check, loading, and kernel callables.

The library is native code, the one thing an artifact carries that runs, so it is loaded only
from the bytes that were verified: they are written to a private, sealed memory file (memfd;
where the kernel forbids executable memfds, an unlinked file in a private directory) and
`dlopen`ed from there, never from the artifact's path, so a file swapped on disk after the
check changes nothing. Each load gets its own copy, so re-exporting to the same path and loading
again loads the new kernels (dlopen would hand back a cached library for a reused name), and the
library is closed when the last module using it is gone.

Kernels are found through the library's own table (`aotc_kernel_table`: name, address, argument
count, size count and pointer dtypes of each kernel; format >= 5), and the few symbols looked
up by name must resolve inside this library, not in one it depends on (libc's `system` is not a
kernel). Each kernel is an `extern "C" int name(T* ...)` taking data pointers (inputs, then
outputs), from format 17 the room of each (its table entry's dtypes end in ";room",
codegen/cpp/room.py), and sizes; it returns a positive code when an indexing input was out of
range and -1 - i when pointer i has less room than the kernel indexes.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import re
import tempfile
import threading
import weakref

import torch

from aotc.errors import ArtifactError, TargetError
from aotc.artifact.format import ROOM_MARKER
from aotc.artifact.isa import arch_of, host_arch, missing_flags, supported

LEGACY_KERNEL = re.compile(r"(?:forward_|backward_)?kernel[0-9]{1,7}\Z")
# libraries a kernel library links (OpenMP, the C++ runtime): kept loaded once a kernel library
# used them, so closing it never unloads an OpenMP runtime whose threads still exist
RUNTIME_LIBS = ("libgomp.so.1", "libomp.so", "libiomp5.so", "libstdc++.so.6", "libgcc_s.so.1")
_SEALS = getattr(fcntl, "F_SEAL_SEAL", 1) | getattr(fcntl, "F_SEAL_SHRINK", 2) | \
    getattr(fcntl, "F_SEAL_GROW", 4) | getattr(fcntl, "F_SEAL_WRITE", 8)
_pinned_fds: list[int] = []      # memfds of libraries dlclose left mapped: names never reused
_lock = threading.Lock()


def select_level(native, wanted: str | None = None) -> str:
    """The level whose library this host loads: `wanted` if given (it must be one the artifact
    carries and this CPU supports), else the best of the artifact's levels this CPU supports;
    a TargetError naming the levels and what this CPU lacks where there is none."""
    levels = native.levels
    if wanted is not None:
        if wanted not in levels:
            raise TargetError(f"the artifact has no kernels built for {wanted}",
                              where="aotc.load(isa=)", expected=list(levels), found=wanted,
                              fix="load with one of the levels listed, or leave isa unset")
        check_level(wanted)
        return wanted
    usable = [level for level in levels if supported(level)]
    if not usable:
        check_level(levels[0])      # raises: says what this host lacks for the lowest level
    return usable[-1]


def check_level(isa: str) -> None:
    arch = arch_of(isa)
    if arch != host_arch():
        raise TargetError(f"artifact kernels were built for {arch} ({isa}); this host is "
                          f"{host_arch()}", where="manifest target.native.libraries",
                          expected=arch, found=host_arch(),
                          fix=f"re-export on a {host_arch()} host, or export with --no-codegen")
    missing = missing_flags(isa)
    if missing:
        raise TargetError(f"artifact kernels need CPU level {isa}; this CPU lacks "
                          f"{', '.join(missing)}", where="manifest target.native.libraries",
                          expected=f"a CPU with {isa}", found=f"missing {', '.join(missing)}",
                          fix="re-export with --isa auto (it includes the x86-64-v2 baseline) "
                              "or a level this host has")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


class _TableEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("fn", ctypes.c_void_p), ("nargs", ctypes.c_int),
                ("nsizes", ctypes.c_int), ("types", ctypes.c_char_p)]


_libdl = ctypes.CDLL(None)
_libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
_libdl.dladdr.restype = ctypes.c_int


class NativeLibrary:
    """One loaded kernel library, private to the modules that hold it."""

    def __init__(self, data: bytes, native, digest: str, level: str):
        check_level(level)
        self.level, self.where = level, native.library(level)
        self.fd, self.path = _private_copy(data, digest)
        try:
            self.cdll = ctypes.CDLL(self.path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            _close_copy(self.fd, self.path)
            raise ArtifactError("the artifact's kernel library cannot be loaded",
                                where=self.where, expected="a shared library for this host",
                                found=str(e)[:300], fix="re-export the model on this host") \
                from None
        _pin_runtime_libs()
        self._finalizer = weakref.finalize(self, _release, self.cdll._handle, self.fd, self.path)
        # a library that has a table is read through it whatever the manifest says (a manifest
        # claiming format <= 4 must not turn off the checks the table carries)
        self.kernels = (self._table() if native.table or self._own_address("aotc_kernel_table")
                        else None)
        self.set_threads = self._own_function("aotc_set_num_threads", [ctypes.c_int], None)
        self.set_threads_address = self._own_address("aotc_set_num_threads") or 0

    def _own_address(self, name: str) -> int | None:
        """The address of symbol `name` if this library itself defines it (None otherwise)."""
        try:
            addr = ctypes.cast(getattr(self.cdll, name), ctypes.c_void_p).value
        except AttributeError:
            return None
        info = _DlInfo()
        if not addr or not _libdl.dladdr(ctypes.c_void_p(addr), ctypes.byref(info)):
            return None
        return addr if info.dli_fname and info.dli_fname.decode() == self.path else None

    def _own_function(self, name: str, argtypes: list, restype):
        addr = self._own_address(name)
        if addr is None:
            return None
        return ctypes.CFUNCTYPE(restype, *argtypes)(addr)

    def _table(self) -> dict:
        get = self._own_function("aotc_kernel_table", [ctypes.POINTER(ctypes.c_int)],
                                 ctypes.POINTER(_TableEntry))
        if get is None:
            raise ArtifactError("the kernel library has no kernel table",
                                where=self.where, expected="aotc_kernel_table",
                                found="no such symbol in the library", fix="re-export the model")
        n = ctypes.c_int()
        entries = get(ctypes.byref(n))
        out = {}
        for i in range(max(0, min(n.value, 1 << 20))):
            e = entries[i]
            types = (e.types or b"").decode()
            room = types.endswith(ROOM_MARKER)
            out[e.name.decode()] = (e.fn, e.nargs, e.nsizes, types.removesuffix(ROOM_MARKER), room)
        return out

    def takes_room(self, name: str) -> bool:
        """Whether kernel `name` takes the room of its pointers (codegen/cpp/room.py), as the
        library's own table says: a plan cannot turn the check off."""
        return self.kernels is not None and name in self.kernels and self.kernels[name][4]

    def kernel(self, name: str, nargs: int, nsizes: int, dtypes: list[str]):
        """A callable for kernel `name` taking `nargs` data pointers and `nsizes` sizes; the
        library must define it with exactly that many arguments of those dtypes."""
        room = [ctypes.c_void_p] if self.takes_room(name) else []
        proto = ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] * nargs + room
                                                 + [ctypes.c_int64] * nsizes))
        return proto(self.kernel_address(name, nargs, nsizes, dtypes))

    def kernel_address(self, name: str, nargs: int, nsizes: int, dtypes: list[str]) -> int:
        """The address of kernel `name`, checked as `kernel` checks it (the C++ runner calls
        kernels by address)."""
        if self.kernels is not None:
            entry = self.kernels.get(name)
            if entry is None:
                raise _missing(name, sorted(self.kernels)[:8])
            addr, want_args, want_sizes, types, _ = entry
            found = (want_args, want_sizes, types)
            if found != (nargs, nsizes, ",".join(dtypes)):
                raise ArtifactError(f"the plan calls kernel {name} with arguments its library "
                                    "does not take", where=f"plan step {name}",
                                    expected=f"{want_args} pointers ({types}), {want_sizes} sizes",
                                    found=f"{nargs} pointers ({','.join(dtypes)}), {nsizes} sizes",
                                    fix="re-export the model (plan and library do not match)")
        else:   # format <= 4: no table; only aotc's kernel names, defined in this library
            addr = self._own_address(name) if LEGACY_KERNEL.match(name) else None
            if addr is None:
                raise _missing(name, [])
        return addr


def _missing(name: str, known: list) -> ArtifactError:
    return ArtifactError(f"the plan calls kernel {name}, which the kernel library lacks",
                         where=f"plan step {name}", expected=known or "an aotc kernel name",
                         found=name, fix="re-export the model")


def _private_copy(data: bytes, digest: str) -> tuple[int, str]:
    """A sealed memfd holding `data` (fd, path to dlopen); or, where executable memfds are
    refused, a private file (fd -1, its path; unlinked once loaded)."""
    try:
        fd = os.memfd_create(f"aotc-kernels-{digest[:12]}",
                             os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        try:
            _write_all(fd, data)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            path = f"/proc/self/fd/{fd}"
            if os.path.exists(path):
                return fd, path
        except OSError:
            pass
        os.close(fd)
    return -1, _private_file(data)


def _private_file(data: bytes) -> str:
    for base in (None, os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        try:
            d = tempfile.mkdtemp(prefix="aotc-lib-", dir=base)
        except OSError:
            continue
        path = os.path.join(d, "kernels.so")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o500)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        return path
    raise ArtifactError("no private place to load the kernel library from",
                        where="memfd, TMPDIR, XDG_RUNTIME_DIR, /dev/shm",
                        expected="an executable memfd or a writable temporary directory",
                        found="none", fix="set TMPDIR to a writable directory")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _close_copy(fd: int, path: str) -> None:
    if fd >= 0:
        os.close(fd)
    else:
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass


def _release(handle: int, fd: int, path: str) -> None:
    """Close a library no module uses any more. If it stays mapped (dlclose may keep it), its
    memfd stays open so no later load can be given it under the same name."""
    import _ctypes
    with _lock:
        _ctypes.dlclose(handle)
        try:
            again = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_NOLOAD)
        except OSError:
            again = None
        if again is not None:
            _ctypes.dlclose(again._handle)
            if fd >= 0:
                _pinned_fds.append(fd)
            return
        _close_copy(fd, path)


def _pin_runtime_libs() -> None:
    for name in RUNTIME_LIBS:
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_NOLOAD | os.RTLD_NODELETE)
        except OSError:
            pass


class ThreadCount:
    """Keeps a kernel library's OpenMP threads at torch.get_num_threads() for each thread that
    calls it (OpenMP's thread count is a setting of the calling thread): a server that gives
    torch n threads per worker gets kernels on n threads, not on every core. One comparison per
    call; the library is told only when the count changes."""

    def __init__(self, setter):
        self.set = setter
        self.local = threading.local()

    def __call__(self) -> None:
        n = torch.get_num_threads()
        if getattr(self.local, "n", None) != n:
            self.set(n)
            self.local.n = n


def thread_count(lib) -> ThreadCount | None:
    """A ThreadCount for a CPU kernel library that has the setter (libraries of artifacts
    exported before it existed do not: their kernels keep OpenMP's defaults)."""
    setter = getattr(lib, "set_threads", None)
    return ThreadCount(setter) if setter is not None else None
