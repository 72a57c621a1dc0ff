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

import copy
import dataclasses
import functools
import importlib.util
import os
import re
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from aotc.codegen.shapes import numbered
from aotc.errors import LoweringError, UsageError
from aotc.artifact import format as fmt
from aotc.runtime.interpret import interpreter_env
from aotc.artifact.staging import Staging

NUM_STAGES = 1                 # pointwise and reduction kernels: no software pipelining
SCRATCH = ("global_scratch", "profile_scratch")   # appended by Triton >= 3.3, in this order


@dataclass(frozen=True, slots=True)
class KernelSource:
    """One kernel as Triton source, with what `triton.compile` and a launcher need."""
    name: str
    text: str
    ins: list                 # buffers read (pointer params, first)
    outs: list                # buffers written that other steps read (pointer params, next)
    sizes: list               # dim-size symbols taken as params `s_<name>` (i32, i64 if wide)
    signature: dict           # param name -> Triton type, in order (excluding constexprs)
    constexprs: dict          # block sizes
    grid: list                # three Python expressions over the plan's size symbols
    num_warps: int
    error_code: int | None    # what the kernel stores into aotc_err for an index out of range
    aligned: tuple = ()       # size params in load/store addresses: the div16 variant's
    num_stages: int | None = None   # software pipelining of loops (None: NUM_STAGES)


# Programmatic dependent launch (sm_90 and newer): every kernel takes this constexpr, False by
# default (the interpreter, older GPUs). Built for sm_90+ it is True: the kernel lets the next
# one launch (griddepcontrol.launch_dependents) and waits until the kernel before it on the
# stream has finished and its writes are visible (griddepcontrol.wait): hand-written kernels
# first thing, generated ones before their first statement that stores or reads what another
# kernel writes (pdl_body). Launched with the programmatic-serialization attribute, a kernel's
# launch, block scheduling and weight loads then overlap its predecessor's tail instead of
# following it; nothing reads what a kernel writes or writes anything before the wait, so any
# order of kernels stays correct.
PDL = "AOTC_PDL"
PDL_MIN_ARCH = 90
PDL_PARAM = f"{PDL}: tl.constexpr = False"
PDL_LINES = (f"if {PDL}:", "    tl.extra.cuda.gdc_wait()",
             "    tl.extra.cuda.gdc_launch_dependents()")   # hand-written kernels' first lines
PDL_TRIGGER = (f"if {PDL}:", "    tl.extra.cuda.gdc_launch_dependents()")
PDL_WAIT = (f"if {PDL}:", "    tl.extra.cuda.gdc_wait()")
# what a line must not do before the wait: store, or name a buffer other kernels write
_DEPENDENT = re.compile(r"\btl\.(store|atomic_\w+)\(|\baotc_err\b|\b(buf\d+)\b")


def pdl_body(body: list[str], buffers: dict, grid=None, statistics_first: bool = False
             ) -> list[str]:
    """A generated kernel's body lines with programmatic dependent launch: the trigger that
    lets the next kernel launch first, then the body with the wait for the predecessor placed
    before the first top-level statement that stores, or names a buffer of `buffers` that is
    not `constant` (weights and views of them: no kernel writes those). What comes before it
    (program ids, index arithmetic, weight loads) runs while the predecessor finishes: one-row
    products start streaming their weights during the previous kernel's last wave. A statement
    is a top-level line with the lines indented under it (a loop, an `if` with its `else`), so
    the wait is never inside a loop or a branch; comments never count. A kernel of
    `few_programs(grid)` also loads the weights it reads before its first loop before the wait
    (hoist_early): it is bound by latency, and a weight row it loaded after its reduction (an
    RMSNorm's) was a memory round trip more on the step's critical path. A product that
    computes its x's row statistics first (`statistics_first`: codegen/lowering/row_statistics.py)
    waits before them (they read the previous kernel's output), and loads its first product's
    weights before the wait too, as a product reading a stored x does."""
    constants = {n for n, b in buffers.items() if b.constant}
    groups = _statements(body)
    at = next((i for i, g in enumerate(groups)
               if any(_depends(ln, constants) for ln in g)), len(groups))
    end = None
    if few_programs(grid):     # up to its first loop: nothing is held in registers across one
        end = next((i for i in range(at, len(groups)) if len(groups[i]) > 1), len(groups))
    elif statistics_first:     # through the end of the first product's statements
        end = (_node_starts(groups, at)[1:2] or [len(groups)])[0]
    if end is not None:
        early, late = hoist_early(groups[at:end], constants)
        groups = [*groups[:at], *early, *late, *groups[end:]]
        at += len(early)
    # Only what precedes the first dependent statement runs before the wait: moving later
    # independent loads above it too (the up projection's weights beside the gate's, 7922397)
    # made LLaMA's decode step 5-10% slower on the H200 (their loads queue ahead of the
    # RMSNorm's on the step's critical path; benchmarks/results/h200-generate/nohoist/)
    return [*PDL_TRIGGER, *(ln for g in groups[:at] for ln in g), *PDL_WAIT,
            *(ln for g in groups[at:] for ln in g)]


def _node_starts(groups: list, start: int) -> list[int]:
    """The statements from `start` on that begin a node's lines (its `# bufN = ...` comment)."""
    return [i for i in range(start, len(groups)) if _NODE.match(groups[i][0])]


_NODE = re.compile(r"^# buf\d+")


def _statements(body: list[str]) -> list[list[str]]:
    groups: list[list[str]] = []
    for ln in body:
        top = not ln.startswith((" ", "\t")) and not ln.startswith(("else", "elif"))
        if top or not groups:
            groups.append([ln])
        else:
            groups[-1].append(ln)
    return groups


def _depends(line: str, constants: set[str]) -> bool:
    if line.lstrip().startswith("#"):
        return False
    return any(m.group(2) is None or m.group(2) not in constants
               for m in _DEPENDENT.finditer(line))


_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_TARGETS = re.compile(r"^\s*(?:for\s+)?([A-Za-z_][\w, ]*?)\s*(?:[-+*/]?=(?!=)|\bin\b)")
ASSIGNMENT = re.compile(r"^(\w+) = ")    # a one-line statement `name = ...`
# kernels of at most this many programs are bound by latency, not bytes: their weight loads up
# to their first loop go before the PDL wait (a decode step's RMSNorm reads its weight row
# there; benchmarks/results/h100-generate/prologue-hoisted/)
HOIST_PROGRAMS = 8


def hoist_early(lines: list, early: set[str]) -> tuple[list, list]:
    """Statements split into those that may run before the PDL wait and the rest, each in
    their order. A statement is a line, or a list of lines (a loop or branch with its body,
    which never moves). A one-line `name = ...` goes first where it stores nothing, names no
    buffer outside `early` (buffers no kernel of the step writes before this one: weights,
    tables, a position the caller proved early), uses no name a later-placed statement may
    assign, and assigns no name that one may use or assign (so moving it up changes no value).
    The index arithmetic and table rows of a computed operand, or a norm's weight row, then
    overlap the kernel before; what is left after the wait is the loads of that kernel's
    output and the arithmetic on them."""
    groups = [g if isinstance(g, list) else [g] for g in lines]
    code = [[ln for ln in g if not ln.lstrip().startswith("#")] for g in groups]
    assigned = {n.strip() for g in code for ln in g if (m := _TARGETS.match(ln))
                for n in m.group(1).split(",")}
    before, after = [], []
    late_defs, late_uses = set(), set()
    for g, c in zip(groups, code):
        if not c:                  # a comment stays with what follows it
            after.append(g)
            continue
        m = ASSIGNMENT.match(c[0]) if len(c) == 1 else None
        text = "\n".join(c)
        names = set(_NAME.findall(text[m.end():] if m else text)) & assigned
        if (m and "aotc_err" not in text and not re.search(r"\btl\.(store|atomic_\w+)\(", text)
                and set(re.findall(r"\bbuf\d+\b", text)) <= early
                and not names & late_defs and m.group(1) not in late_uses | late_defs):
            before.append(g)
            continue
        after.append(g)
        late_uses |= names
        targets = _TARGETS.match(c[0]) if len(c) == 1 else None
        late_defs |= names if len(c) > 1 else \
            {n.strip() for n in targets.group(1).split(",")} if targets else set()
    unwrap = (lambda gs: gs) if any(isinstance(g, list) for g in lines) else \
        (lambda gs: [g[0] for g in gs])
    return unwrap(before), unwrap(after)


def few_programs(grid) -> bool:
    """Whether a grid (three Python expressions) is static and has at most HOIST_PROGRAMS."""
    if grid is None or not all(str(d).isdigit() for d in grid):
        return False
    return int(grid[0]) * int(grid[1]) * int(grid[2]) <= HOIST_PROGRAMS


def with_pdl(text: str, name: str, waits_itself: bool = False) -> str:
    """A kernel source whose one-line `def name(...):` takes PDL_PARAM and starts with
    PDL_LINES (hand-written kernels; generated ones print both themselves), or, where the
    text places PDL_WAIT itself (`waits_itself`: it reads something before the wait that no
    kernel of the step writes before it), with PDL_TRIGGER alone."""
    head = re.compile(rf"^def {re.escape(name)}\((.*)\):$", re.M)
    m = head.search(text)
    if m is None:
        raise LoweringError(f"kernel {name}'s source has no one-line def", where=name,
                            expected=f"def {name}(...):", found="none",
                            fix="report this as an aotc bug")
    body = "".join(f"\n    {ln}" for ln in (PDL_TRIGGER if waits_itself else PDL_LINES))
    return text[:m.start()] + f"def {name}({m.group(1)}, {PDL_PARAM}):{body}" + text[m.end():]


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
    with Staging("aotc-triton-") as tmp, interpreter_env(False):
        path = Path(tmp) / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"aotc_kernel_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(spec.name, None)
    module.aotc_threadsafe = True
    for fn in vars(module).values():
        if not hasattr(fn, "cache_key"):     # not a jitted function
            continue
        if isinstance(getattr(fn, "file_name", None), str):
            # compiled line info names the file of each jitted function (the kernel and the
            # prelude's helpers): the artifact's own path for it, not the temporary one, or no
            # two exports would give the same cubin
            fn.file_name = fmt.triton_source_file(name)
        if callable(getattr(fn, "parse", None)) and getattr(fn, "src", None):
            # parsed here, once: `ast.parse` is not thread-safe in CPython 3.11/3.12 ("AST
            # constructor recursion depth mismatch"), and compiles run on threads; each
            # compile gets its own copy of the tree
            fn.parse = functools.partial(copy.deepcopy, fn.parse())
        else:
            module.aotc_threadsafe = False
    return module


def compile_kernel(ks, text: str, arch: str) -> tuple[bytes, dict]:
    """(cubin, launch metadata) of kernel `ks` (a KernelSource) built for `arch`."""
    return compile_kernels([(ks, text, arch)])[0]


def compile_kernels(jobs: list, workers: int | None = None) -> list:
    """[(cubin, launch metadata)] for each (KernelSource, source text, arch[, sizes16: size
    parameters declared divisible by 16]) of `jobs`, in order.

    Sources are imported and parsed one at a time (the import reads TRITON_INTERPRET under a
    lock; `ast.parse` is not thread-safe);
    `triton.compile` then runs on a thread pool: most of its time is spent in MLIR passes and
    ptxas, which release the GIL, so threads scale with the cores (about 1.8x on two)."""
    fns, threadsafe = {}, True      # (name, source) -> jitted function: one import each
    for ks, text, *_ in jobs:
        if (ks.name, text) not in fns:
            module = load_module(ks.name, text)
            fns[ks.name, text] = getattr(module, ks.name)
            threadsafe &= module.aotc_threadsafe
    workers = max(1, min(len(jobs), workers or os.cpu_count() or 1)) if threadsafe else 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # Triton 3.9's fp-fusion default notice
        build = lambda job: _compile(fns[job[0].name, job[1]], job[0], *job[2:])  # noqa: E731
        if workers == 1:
            return [build(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(build, jobs))


def kernel_shape(ks, arch: str, sizes16: tuple = ()) -> tuple:
    """What a kernel's cubin depends on, its names aside: its text with the kernel's name
    and each parameter's replaced by their place (comments dropped: they name buffers but
    compile to nothing), the parameters' types, constexprs, warps, stages, arch, and which
    sizes are built divisible by 16. Two kernels of one shape compile to the same code."""
    return (numbered(ks.text, [ks.name, *ks.signature], "#"), tuple(ks.signature.values()),
            tuple(sorted(ks.constexprs.items())), ks.num_warps, ks.num_stages, arch,
            tuple(i for i, n in enumerate(ks.signature) if n in sizes16))


_CODE = re.compile(r"(tl\.store\([^\n]*\baotc_err\b[^\n]*?, )(\d+)(, (?:\w+_)?bad\d+\))")


def _coded(ks, code: int):
    """`ks` storing `code` where it stored its own error code."""
    text = _CODE.sub(lambda m: m.group(1) + str(code) + m.group(3)
                     if int(m.group(2)) == ks.error_code else m.group(0), ks.text)
    return dataclasses.replace(ks, text=text, error_code=code)


def code_free_shape(ks) -> tuple:
    """`kernel_shape` for any arch, whatever error code `ks` stores."""
    return kernel_shape(_coded(ks, 0) if ks.error_code is not None else ks, "")


def share_codes(sources: list) -> list:
    """The kernel sources with one error code per kernel shape: a kernel that differs from an
    earlier one only in its names and in the code it stores for an index out of range (each
    layer's rotary embedding, checking the position) stores that one's code instead, so the
    two compile once (`unique_builds`). A flagged code names every step that stores it; the
    runtime searches them all for the bad index (runtime/indices.py index_error)."""
    first, out = {}, []
    for ks in sources:
        if ks.error_code is None:
            out.append(ks)
            continue
        code = first.setdefault(code_free_shape(ks), ks.error_code)
        out.append(ks if code == ks.error_code else _coded(ks, code))
    return out


def unique_builds(jobs: list, workers: int | None = None) -> list:
    """`compile_kernels(jobs)`, compiling each kernel shape (`kernel_shape`) once: a job of a
    shape compiled before gets that cubin and launch metadata, its parameters renamed to its
    own (the symbol stays the first kernel's: the cubin's entry). A decoder's layers are
    kernels of a few shapes repeated: a 16-layer LLaMA's decode and prefill compile 30 cubins
    for 245 kernels (benchmarks/results/cpu-export-shapes/)."""
    keys = [kernel_shape(job[0], *job[2:]) for job in jobs]
    first: dict = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    firsts = sorted(set(first.values()))
    built = dict(zip(firsts, compile_kernels([jobs[i] for i in firsts], workers)))
    out = []
    for job, key in zip(jobs, keys):
        cubin, meta = built[first[key]]
        params = [dict(p, name=n) for p, n in zip(meta["params"], job[0].signature)]
        out.append((cubin, dict(meta, params=params + meta["params"][len(params):])))
    return out


def _compile(fn, ks, arch: str, sizes16: tuple = ()) -> tuple[bytes, dict]:
    """`sizes16`: size parameters (`s_<name>`) declared divisible by 16 too (the "div16"
    variant: strides that are multiples of a dynamic size stay provably aligned, so loads
    vectorize)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    constexprs = dict(ks.constexprs)
    pdl = arch_number(arch) >= PDL_MIN_ARCH and PDL in fn.arg_names
    if PDL in fn.arg_names:
        constexprs[PDL] = pdl
    signature = dict(ks.signature, **{c: "constexpr" for c in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(ks.signature.items())
             if t.startswith("*") or n in sizes16}
    options = {"num_warps": ks.num_warps, "num_stages": ks.num_stages or NUM_STAGES, "enable_fp_fusion": True}
    try:
        compiled = triton.compile(ASTSource(fn=fn, signature=signature,
                                            constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", arch_number(arch), 32),
                                  options=options)
    except Exception as e:   # Triton raises many classes (CompilationError, RuntimeError, ...)
        raise LoweringError(f"Triton could not compile kernel {ks.name} for {arch}: "
                            f"{type(e).__name__}: {str(e)[-2000:]}", where=f"kernels/{ks.name}.py",
                            expected="a kernel Triton compiles", found=type(e).__name__,
                            fix="report this as an aotc bug with the model; meanwhile export "
                                "with --no-codegen to use ATen kernels only") from e
    meta = launch_metadata(ks, compiled)
    if pdl:
        meta["pdl"] = True
    return compiled.asm["cubin"], meta


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
