"""Builds aotc's C++ runtime against the torch installed at build time; everything else is
declared in pyproject.toml.

Two front ends share one plan runner (runtime/cpp):
  - `libaotc_runtime.so` (runtime/cpp/lib/): the runner and the Python-free front end
    (`aotc::Module`, runtime/cpp/frontend), a plain shared library linking libtorch and
    OpenSSL's libcrypto (hashes, signatures; JSON is nlohmann/json's, header-only: the system
    packages libssl-dev and nlohmann-json3-dev on Debian and Ubuntu); with
    its headers (runtime/cpp/include) and CMake config (runtime/cpp/cmake/aotcConfig.cmake) it is
    what `aotc config --cmake-prefix-path` points C++ programs at;
  - `aotc.runtime._runner`: the Python bindings (runtime/cpp/python.cpp), linking that library.
Both need torch importable while building: install torch first and build without isolation
(`pip install --no-build-isolation .`). Where torch or a compiler is missing, or the build fails,
aotc installs without them and runs every plan with its Python runner; `aotc config --runner`
says which runner is in use and why.
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent / "src" / "aotc"   # the package's sources
RUNNER = ["program.cpp", "call.cpp", "aotc_ops.cpp", "guards.cpp", "cuda.cpp", "binds.cpp",
          "room.cpp", "few_rows.cpp"]
FRONTEND = ["json.cpp", "files.cpp", "package.cpp", "native.cpp", "library.cpp", "spec.cpp",
            "guard_errors.cpp", "module.cpp", "tensors.cpp", "keys.cpp", "signing.cpp", "oms.cpp",
            "cuda_kernels.cpp", "graphs.cpp", "plan_check.cpp", "expr_check.cpp",
            "runner_match.cpp", "manifest_check.cpp"]
# files of their own flags: at::parallel_for is inline OpenMP, so a file calling it compiles
# with -fopenmp (its GOMP calls resolve to the libgomp torch ships and libtorch_cpu loads);
# few_rows.cpp's product wants -O3 (few_rows.cpp says why)
OWN_FLAGS = {"runtime/cpp/few_rows.cpp": ["-O3", "-fopenmp"]}
SOURCES = [f"runtime/cpp/{s}" for s in RUNNER] + [f"runtime/cpp/frontend/{s}" for s in FRONTEND]
LIBRARY = "libaotc_runtime.so"


def _flags(torch) -> list[str]:
    from torch.utils.cpp_extension import include_paths
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    ops = HERE / "artifact/schema/extern_ops.txt"
    return ["-O2", "-std=c++20", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f'-DAOTC_TORCH_VERSION="{torch.__version__}"', f'-DAOTC_EXTERN_OPS="{ops}"',
            f"-I{HERE / 'runtime/cpp/include'}", *(f"-I{p}" for p in include_paths())]


def _cuda_include_dirs() -> list[Path]:
    """Where CUDA's runtime headers may be: CUDA_HOME / CUDA_PATH, torch's guess of the
    toolkit, the include folders of NVIDIA's pip packages."""
    dirs = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    try:
        from torch.utils.cpp_extension import CUDA_HOME
        dirs.append(CUDA_HOME)
    except ImportError:
        pass
    out = [Path(d) / "include" for d in dirs if d]
    try:
        import nvidia
        for base in nvidia.__path__:
            out += sorted(Path(base).glob("*/include"))
    except ImportError:
        pass
    return [d for d in dict.fromkeys(out) if d.is_dir()]


def cuda_graph_flags(torch, cxx: str, flags: list[str], temp: Path) -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for the C++ front end's CUDA graphs (frontend/graphs.cpp,
    through torch's own CUDA graph class): where torch was built for CUDA and a test compile
    of that class's header finds CUDA's runtime headers; else none, and the front end runs
    CUDA artifacts without graphs, saying why (Module::graph_status)."""
    if torch.version.cuda is None:
        return [], []
    inc = [f"-I{d}" for d in _cuda_include_dirs()]
    probe = temp / "cuda_graphs_probe.cpp"
    probe.write_text("#include <ATen/cuda/CUDAGraph.h>\n#include <c10/cuda/CUDAGuard.h>\n")
    done = subprocess.run([cxx, *flags, *inc, "-fsyntax-only", str(probe)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        print("aotc: CUDA's runtime headers were not found (set CUDA_HOME); the C++ front end "
              "will run CUDA artifacts without CUDA graphs", file=sys.stderr)
        return [], []
    return ["-DAOTC_CUDA_GRAPHS", *inc], ["-ltorch_cuda", "-lc10_cuda"]


def build_library(out_dir: Path, temp: Path) -> Path:
    """libaotc_runtime.so in `out_dir`, objects in `temp` (rebuilt only where older than
    their source), sources compiled in parallel: with the front end's CUDA graphs where they
    build, else without them (a failure there never costs the runner)."""
    import torch
    cxx = os.environ.get("CXX", "c++")
    flags = _flags(torch)
    temp.mkdir(parents=True, exist_ok=True)
    graph_flags, graph_libs = cuda_graph_flags(torch, cxx, flags, temp)
    if graph_flags:
        try:
            return _build(cxx, flags, out_dir, temp, graph_flags, graph_libs)
        except subprocess.CalledProcessError as e:
            print(f"aotc: the C++ front end's CUDA graphs did not build ({e}); building the "
                  "runtime without them", file=sys.stderr)
    return _build(cxx, flags, out_dir, temp, [], [])


def _build(cxx: str, flags: list[str], out_dir: Path, temp: Path, graph_flags: list[str],
           graph_libs: list[str]) -> Path:
    from torch.utils.cpp_extension import library_paths
    headers = max(p.stat().st_mtime for p in (HERE / "runtime/cpp").rglob("*.h"))

    def compile_one(src: str) -> Path:
        extra = graph_flags if src.endswith("/graphs.cpp") else \
            OWN_FLAGS.get(src, [])
        obj = temp / (src.replace("/", "_") + ("_graphs" if extra == graph_flags != [] else "")
                      + ".o")
        if not obj.exists() or obj.stat().st_mtime < max((HERE / src).stat().st_mtime, headers):
            subprocess.run([cxx, *flags, *extra, "-c", str(HERE / src), "-o", str(obj)],
                           check=True)
        return obj
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        objects = list(pool.map(compile_one, SOURCES))
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / LIBRARY
    torch_lib = library_paths()[0]
    subprocess.run([cxx, "-shared", *map(str, objects), "-o", str(lib), f"-L{torch_lib}",
                    f"-Wl,-rpath,{torch_lib}", "-lc10", "-ltorch_cpu", "-ltorch", *graph_libs,
                    "-lcrypto", "-ldl"], check=True)
    return lib


def runner_extension() -> dict:
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:    # an isolated build: no torch to build against
        return {}

    class Build(BuildExtension):
        def _library(self) -> Path:
            return Path(self.get_ext_fullpath("aotc.runtime._runner")).parent / "cpp" / "lib"

        def get_outputs(self):   # the library is installed with the extension
            return [*super().get_outputs(), str(self._library() / LIBRARY)]

        def copy_extensions_to_source(self):   # editable installs: beside the sources
            super().copy_extensions_to_source()
            built = getattr(self, "built_library", None)
            if built is not None:
                (HERE / "runtime/cpp/lib").mkdir(exist_ok=True)
                self.copy_file(str(built), str(HERE / "runtime/cpp/lib" / LIBRARY))

        def build_extensions(self):
            out = self._library()
            try:
                self.built_library = build_library(out, Path(self.build_temp) / "aotc_runtime")
            except (OSError, subprocess.CalledProcessError) as e:
                print(f"aotc: the C++ runtime did not build ({e}); installing without it",
                      file=sys.stderr)
                return
            for ext in self.extensions:
                ext.library_dirs.append(str(out))
            super().build_extensions()

    ext = CppExtension("aotc.runtime._runner", ["src/aotc/runtime/cpp/python.cpp"], optional=True,
                       libraries=["aotc_runtime"],
                       extra_link_args=["-Wl,-rpath,$ORIGIN/cpp/lib"],
                       extra_compile_args=["-O2", "-std=c++20", "-fvisibility=hidden",
                                           f'-DAOTC_TORCH_VERSION="{torch.__version__}"'])
    return {"ext_modules": [ext], "cmdclass": {"build_ext": Build}}


setup(**runner_extension())
