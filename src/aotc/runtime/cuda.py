"""Running cubins: the CUDA driver API through ctypes (libcuda.so.1), never Triton.

At load, the cubin built for this GPU's architecture is chosen (an sm_90 cubin runs on sm_90
only: Triton emits arch-specific code from sm_90 on; below that a cubin runs on GPUs of the same
major version and an equal or newer minor one) and loaded with cuModuleLoadData into the device's
primary context (the one torch uses). A launch packs the kernel's parameters (data pointers,
sizes, then the scratch pointers newer Triton versions append) and calls cuLaunchKernel on
torch's current stream; a cubin built for programmatic dependent launch (launch spec `pdl`,
sm_90 and newer: it waits for the kernel before it before it touches what kernels write) goes
through cuLaunchKernelEx with programmatic stream serialization, so its launch overlaps the end of its
predecessor, in a stream and in a captured CUDA graph alike. AOTC_CUDA_PDL=0 launches those
cubins plainly (their wait is then a no-op), to compare or to rule the overlap out; so does a
driver that lacks cuLaunchKernelEx or refuses the attribute.
"""
from __future__ import annotations

import ctypes
import os
import threading
import weakref

import torch

from aotc.errors import TargetError
from aotc.runtime.kernels import TritonKernels

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
STATIC_SHARED_LIMIT = 48 * 1024
SIZES = frozenset({"i32", "i64"})   # the types of dim-size parameters
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig of cuLaunchKernelEx."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("count", ctypes.c_uint)]


PROGRAMMATIC = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)


def pdl_enabled() -> bool:
    """Whether cubins built for programmatic dependent launch are launched with it."""
    return os.environ.get("AOTC_CUDA_PDL", "1") != "0"

_lock = threading.Lock()
_driver = None


class Driver:
    """The few libcuda entry points aotc uses, with error checking."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise TargetError("the CUDA driver (libcuda.so.1) cannot be loaded", where="libcuda",
                              expected="an NVIDIA driver", found=str(e),
                              fix="run on a host with an NVIDIA GPU and driver") from None
        self.lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        self.launch_ex = getattr(self.lib, "cuLaunchKernelEx", None)   # drivers of CUDA 11.8+
        if self.launch_ex is not None:
            self.launch_ex.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_void_p)]
        self.check("cuInit", self.lib.cuInit(0))

    def check(self, what: str, status: int) -> None:
        if status != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(status, ctypes.byref(name))
            text = name.value.decode() if name.value else str(status)
            raise RuntimeError(f"CUDA driver call {what} failed: {text}")

    def device(self, index: int) -> ctypes.c_int:
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), index))
        return dev

    def capability(self, index: int) -> tuple[int, int]:
        dev, out = self.device(index), []
        for attr in (CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                     CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR):
            v = ctypes.c_int()
            self.check("cuDeviceGetAttribute",
                       self.lib.cuDeviceGetAttribute(ctypes.byref(v), attr, dev))
            out.append(v.value)
        return out[0], out[1]

    def primary_context(self, index: int) -> ctypes.c_void_p:
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain",
                   self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.device(index)))
        return ctx

    def make_current(self, ctx: ctypes.c_void_p) -> None:
        cur = ctypes.c_void_p()
        self.check("cuCtxGetCurrent", self.lib.cuCtxGetCurrent(ctypes.byref(cur)))
        if cur.value != ctx.value:
            self.check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))

    def function(self, image: bytes, symbol: str, shared: int):
        """Load a cubin image and return (module, function), allowing `shared` bytes of
        dynamic shared memory."""
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.check("cuModuleLoadData", self.lib.cuModuleLoadData(ctypes.byref(module), image))
        self.check("cuModuleGetFunction", self.lib.cuModuleGetFunction(
            ctypes.byref(fn), module, symbol.encode()))
        if shared > STATIC_SHARED_LIMIT:
            self.check("cuFuncSetAttribute", self.lib.cuFuncSetAttribute(
                fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared))
        return module, fn


def driver() -> Driver:
    global _driver
    with _lock:
        if _driver is None:
            _driver = Driver()
        return _driver


def device_arch(index: int) -> str:
    major, minor = driver().capability(index)
    return f"sm_{major}{minor}"


def select_arch(built: list[str], device: str) -> str:
    """The built arch whose cubin runs on a GPU of arch `device`, else a TargetError."""
    def num(a):
        return int(a[3:].rstrip("a"))
    want = num(device)
    for a in built:
        if num(a) == want:
            return a
    compatible = [a for a in built if want < 90 and num(a) // 10 == want // 10 and num(a) < want]
    if compatible:
        return max(compatible, key=num)
    raise TargetError(f"artifact kernels were built for {', '.join(built)}; this GPU is {device}",
                      where="manifest target.native.archs", expected=", ".join(built),
                      found=device, fix=f"re-export with --target cuda:{device} (several archs: "
                                        f"--target cuda:{','.join([*built, device])})")


class CudaKernels(TritonKernels):
    """An artifact's cubins loaded on one GPU (from the verified bytes the artifact read)."""

    takes_tensors = True

    def __init__(self, artifact, native, device: torch.device):
        super().__init__(artifact, native, device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.arch = select_arch(list(native.archs), device_arch(index))
        torch.cuda.init()
        self.context = driver().primary_context(index)
        driver().make_current(self.context)
        self.modules: list = []
        self.loaded: dict = {}     # (cubin bytes, symbol, shared) -> (CUfunction, CUmodule)
        self.launchers = {name: self._load(name, spec) for name, spec in self.specs.items()}
        weakref.finalize(self, _unload, self.context, self.modules)

    def _load(self, name: str, spec) -> "CudaLauncher":
        if self.arch not in spec.archs:
            raise TargetError(f"kernel {name} has no cubin for {self.arch}", where=name,
                              expected=self.arch, found=sorted(spec.archs),
                              fix="re-export the model for this GPU")
        build, div16 = spec.archs[self.arch]
        return CudaLauncher(name, *self._function(build), build, spec, self,
                            None if div16 is None else (*self._function(div16), div16))

    def _function(self, build) -> tuple:
        """(CUfunction, CUmodule) of the cubin `build` names, each distinct cubin loaded once:
        the kernels of one shape carry the same bytes (codegen/shapes.py), so a decoder's
        layers share their modules."""
        image = self.artifact.read(build.cubin)
        key = (image, build.symbol, build.shared)
        if key not in self.loaded:
            module, fn = driver().function(image, build.symbol, build.shared)
            self.modules.append(module)
            self.loaded[key] = (fn, module)
        return self.loaded[key]

    def kernel(self, name: str, nargs: int, nsizes: int, dtypes: list[str]) -> "CudaLauncher":
        self.check_step(name, nargs, nsizes, dtypes)
        return self.launchers[name]

    def runner_launcher(self, name: str, nargs: int, nsizes: int, dtypes: list[str]) -> dict:
        """The C++ runner launches the cubin itself (runtime/cpp/cuda.cpp)."""
        return self.kernel(name, nargs, nsizes, dtypes).runner_spec()


def _unload(context, modules: list) -> None:
    """Unload a module's cubins once no CompiledModule uses them."""
    try:
        d = driver()
        d.make_current(context)
        for m in modules:
            d.lib.cuModuleUnload(m)
    except Exception:   # noqa: BLE001 - at interpreter exit the driver may be gone
        pass


class CudaLauncher:
    """Launches one kernel: `launcher((gx, gy, gz), *args)`, args in parameter order.

    Every parameter aotc passes fits 8 bytes (data pointers, int32 or int64 sizes, scratch
    pointers), so a launch packs them into one array of 64-bit values plus one array of
    pointers to them (the driver reads an i32 parameter's 4 bytes from the low, little-endian
    half of its slot)."""

    def __init__(self, name: str, fn, module, build, spec, owner: CudaKernels,
                 div16: tuple | None = None):
        """`div16`: (function, module, build) of the variant built for the sizes in its
        addresses divisible by 16 (its build names them), launched when they are."""
        self.name, self.fn, self.module, self.owner = name, fn, module, owner
        self.threads = 32 * build.num_warps
        self.shared = build.shared
        self.ctas = build.num_ctas
        self.pdl = build.pdl and pdl_enabled()
        self.block = (ctypes.c_uint * 3)(self.threads, 1, 1)   # (cuLaunchKernelEx's, read-only)
        self.params = build.params
        self.user = [p for p in self.params if p.type != "scratch"]
        self.scratch = [p for p in self.params if p.type == "scratch"]
        self.pointers = [p.type.startswith("*") for p in self.user]
        self.div16 = None if div16 is None else (div16[0], div16[1], div16[2].shared)
        aligned = div16[2].sizes if div16 is not None else ()
        self.aligned = [i for i, p in enumerate(self.user) if p.name in aligned]
        self.inputs = [p.name in spec.inputs for p in self.user]
        unknown = {p.type for p in self.user if not p.type.startswith("*")} - SIZES
        if unknown:
            raise TargetError(f"kernel {name} takes parameters of types {sorted(unknown)}",
                              where=name, expected="pointers and i32/i64 sizes", found=unknown,
                              fix="re-export with this aotc")

    def runner_spec(self) -> dict:
        """This launcher as the C++ runner's CudaLauncher takes it (runtime/cpp/launch.h
        CudaKernelSpec): the same functions, packing and launch, without Python per launch.
        The runner's program is held by a plan function that holds these kernels, so the
        functions outlive it."""
        div16 = self.div16 or (None, None, 0)
        return {"name": self.name, "function": self.fn.value, "shared": self.shared,
                "div16_function": div16[0].value if div16[0] is not None else 0,
                "div16_shared": div16[2], "aligned": self.aligned, "threads": self.threads,
                "ctas": self.ctas, "pdl": bool(self.pdl), "pointers": self.pointers,
                "inputs": self.inputs, "scratch": [(p.bytes, p.align) for p in self.scratch],
                "context": self.owner.context.value, "device": self.owner.device.index}

    def _aligned(self, t: torch.Tensor, keep: list) -> int:
        """An input's data pointer, copied first if it is not 16-byte aligned (kernels are
        compiled assuming aligned buffers, which lets Triton vectorize their accesses)."""
        t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
        keep.append(t)
        return t.data_ptr()

    def _values(self, grid, args) -> tuple[list, list]:
        """The kernel's parameter values as integers, in order, and what must stay alive."""
        values, keep = [], []
        for pointer, is_input, a in zip(self.pointers, self.inputs, args):
            if not pointer:
                values.append(int(a))
                continue
            ptr = a.data_ptr()
            values.append(self._aligned(a, keep) if ptr % 16 and is_input else ptr)
        programs = grid[0] * grid[1] * grid[2] * self.ctas
        for p in self.scratch:
            ptr = 0
            if p.bytes:
                buf = torch.empty(programs * p.bytes + p.align, dtype=torch.uint8,
                                  device=self.owner.device)
                keep.append(buf)
                ptr = -(-buf.data_ptr() // p.align) * p.align
            values.append(ptr)
        return values, keep

    def function_for(self, values: list) -> tuple:
        """(CUfunction, dynamic shared bytes) to launch with these parameter values: the
        variant built for sizes divisible by 16 when every size is, else the plain cubin."""
        if self.div16 is not None and all(values[i] % 16 == 0 for i in self.aligned):
            return self.div16[0], self.div16[2]
        return self.fn, self.shared

    def __call__(self, grid, *args) -> int:
        if len(args) != len(self.user):
            raise TypeError(f"kernel {self.name} takes {len(self.user)} arguments, got {len(args)}")
        if grid[0] * grid[1] * grid[2] == 0:
            return 0
        d = driver()
        d.make_current(self.owner.context)
        values, keep = self._values(grid, args)
        packed, params = pack(values)
        fn, shared = self.function_for(values)
        stream = current_stream(self.owner.device.index)
        if self.pdl and d.launch_ex is not None:
            config = LaunchConfig((ctypes.c_uint * 3)(*grid), self.block, shared, stream,
                                  ctypes.pointer(PROGRAMMATIC), 1)
            if d.launch_ex(ctypes.byref(config), fn, params, None) == 0:
                return 0
            self.pdl = False   # a driver without the attribute: launch plainly from now on
        d.check(f"cuLaunchKernel({self.name})", d.lib.cuLaunchKernel(
            fn, grid[0], grid[1], grid[2], self.threads, 1, 1, shared,
            ctypes.c_void_p(stream), params, None))
        del keep, packed   # stream order keeps copies and scratch valid until the kernel ran
        return 0


def pack(values: list[int]):
    """(the 8-byte values in one array, cuLaunchKernel's kernelParams: a pointer to each)."""
    n = len(values)
    packed = (ctypes.c_int64 * n)(*values)
    base = ctypes.addressof(packed)
    return packed, (ctypes.c_void_p * n)(*range(base, base + 8 * n, 8))


def current_stream(index: int) -> int:
    """torch's current CUDA stream on device `index`, as a raw handle."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # what Inductor's code uses
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream
