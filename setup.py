"""Builds aotc's optional C++ plan runner (runtime/cpp) against the torch installed at build
time; everything else is declared in pyproject.toml.

The runner is a torch C++ extension, so it needs torch importable while building: install
torch first and build without isolation (`pip install --no-build-isolation .`). Where torch
or a compiler is missing, or the build fails, aotc installs without it and runs every plan
with its Python runner; `aotc config --runner` says which runner is in use and why.
"""
from setuptools import setup

SOURCES = ["runtime/cpp/program.cpp", "runtime/cpp/call.cpp", "runtime/cpp/aotc_ops.cpp",
           "runtime/cpp/guards.cpp", "runtime/cpp/python.cpp"]


def runner_extension() -> dict:
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:    # an isolated build: no torch to build against
        return {}
    ext = CppExtension("aotc.runtime._runner", SOURCES, optional=True,
                       extra_compile_args=["-O2", "-std=c++20", "-fvisibility=hidden",
                                           f'-DAOTC_TORCH_VERSION="{torch.__version__}"'])
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


setup(**runner_extension())
