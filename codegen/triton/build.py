"""Compiling generated Triton kernels into cubins, at export time only, with no GPU needed.

Each kernel's source is imported as a module and compiled with
`triton.compile(ASTSource(...), target=GPUTarget("cuda", <arch>, 32), options=...)` once per
requested arch (cross-compiling for a named arch is a feature: this machine needs no GPU).
Pointer parameters are marked 16-byte aligned (`tt.divisibility`), which lets Triton vectorize
memory accesses; the runtime copies any input that is not so aligned before a launch.

What a launcher needs is read from the compiled kernel, never assumed: the symbol name, the
dynamic shared memory, num_warps, and the parameter list in order, including the scratch
pointers newer Triton versions append (counted from the PTX entry's parameters, named and sized
from the kernel's metadata). Triton keeps its own compile cache (~/.triton/cache), so
re-exporting an unchanged model does not recompile.
"""
from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
import warnings
from pathlib import Path

from aotc.errors import LoweringError, UsageError
from aotc.runtime.interpret import interpreter_env

NUM_STAGES = 1                 # pointwise and reduction kernels: no software pipelining
SCRATCH = ("global_scratch", "profile_scratch")   # appended by Triton >= 3.3, in this order


def triton_version() -> str:
    import triton
    return triton.__version__


def arch_number(arch: str) -> int:
    """'sm_90' -> 90 ('sm_90a' too: Triton emits the arch-specific variant for >= 90 itself)."""
    m = re.fullmatch(r"sm_(\d{2,3})a?", arch)
    if m is None:
        raise UsageError(f"unknown GPU architecture {arch!r}", where="--target",
                         expected="sm_XX, e.g. sm_80 or sm_90", found=arch,
                         fix="use e.g. --target cuda:sm_90")
    return int(m.group(1))


def load_module(name: str, text: str):
    """Import a kernel source as a module (its `@triton.jit` functions compile, never
    interpret, whatever TRITON_INTERPRET says)."""
    with tempfile.TemporaryDirectory(prefix="aotc-triton-") as tmp, interpreter_env(False):
        path = Path(tmp) / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"aotc_kernel_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(spec.name, None)
    return module


def compile_kernel(ks, text: str, arch: str) -> tuple[bytes, dict]:
    """(cubin, launch metadata) of kernel `ks` (a KernelSource) built for `arch`."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = getattr(load_module(ks.name, text), ks.name)
    signature = dict(ks.signature, **{c: "constexpr" for c in ks.constexprs})
    attrs = {(i,): [["tt.divisibility", 16]]
             for i, t in enumerate(ks.signature.values()) if t.startswith("*")}
    options = {"num_warps": ks.num_warps, "num_stages": NUM_STAGES, "enable_fp_fusion": True}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # Triton 3.9's fp-fusion default notice
            compiled = triton.compile(ASTSource(fn=fn, signature=signature,
                                                constexprs=ks.constexprs, attrs=attrs),
                                      target=GPUTarget("cuda", arch_number(arch), 32),
                                      options=options)
    except Exception as e:   # Triton raises many classes (CompilationError, RuntimeError, ...)
        raise LoweringError(f"Triton could not compile kernel {ks.name} for {arch}: "
                            f"{type(e).__name__}: {str(e)[-2000:]}", where=f"kernels/{ks.name}.py",
                            expected="a kernel Triton compiles", found=type(e).__name__,
                            fix="report this as an aotc bug with the model; meanwhile export "
                                "with --no-codegen to use ATen kernels only") from e
    return compiled.asm["cubin"], launch_metadata(ks, compiled)


def ptx_params(ptx: str, symbol: str) -> int:
    """Number of parameters of the PTX entry `symbol`."""
    m = re.search(r"\.entry\s+" + re.escape(symbol) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise LoweringError(f"no PTX entry {symbol} in the compiled kernel", where=symbol,
                            expected="a .entry", found="none", fix="report this as an aotc bug")
    return len(re.findall(r"\.param\b", m.group(1)))


def launch_metadata(ks, compiled) -> dict:
    """Symbol, shared memory, warps and the full parameter list of a compiled kernel."""
    md = compiled.metadata
    params = [{"name": n, "type": t} for n, t in ks.signature.items()]
    extra = ptx_params(compiled.asm["ptx"], md.name) - len(params)
    if extra < 0:
        raise LoweringError(f"kernel {ks.name} compiled with fewer parameters than its signature",
                            where=ks.name, expected=len(params), found=len(params) + extra,
                            fix="report this as an aotc bug (Triton specialized a parameter)")
    for i in range(extra):
        name = SCRATCH[i] if i < len(SCRATCH) else f"scratch{i}"
        params.append({"name": name, "type": "scratch",
                       "bytes": int(getattr(md, f"{name}_size", 0) or 0),
                       "align": int(getattr(md, f"{name}_align", 1) or 1)})
    return {"symbol": md.name, "shared": int(md.shared), "num_warps": int(md.num_warps),
            "num_ctas": int(getattr(md, "num_ctas", 1)), "params": params}
