"""The Triton backend without a GPU (codegen/triton, runtime/cuda.py, runtime/interpret.py).

  (a) cross-compilation: artifacts exported for cuda:sm_90 hold ELF cubins, readable sources and
      launch specs listing every parameter;
  (b) numerics: op patterns compiled for CUDA run through Triton's interpreter
      (`aotc.load(..., device="cpu", interpret=True)`) and are compared with eager;
  (c) end to end: the samples (and GPT-2 when transformers is installed) at small sizes;
  plus units of the GPU path that need no GPU (arch choice, parameter packing), and GPU-only
  tests (marked `gpu`, skipped without one).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import aotc
from aotc.api import compile_function
from aotc.codegen.ir import BINARY, TERNARY, UNARY
from conftest import SAMPLES, assert_matches, eager, run_aotc, subprocess_env

triton = pytest.importorskip("triton")

TARGET = "cuda:sm_90"
# Triton < 3.9's interpreter turns a size argument into an int with int(1-d array), which NumPy 2
# refuses: interpreted kernels with a loop bounded by a dynamic size fail there (cubins do not).
OLD_INTERPRETER = tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9)


def needs_gpu(fn):
    """Marks a test `gpu` and skips it cleanly where torch sees no CUDA GPU."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(),
                                              reason="needs a CUDA GPU")(fn))


@pytest.fixture(autouse=True)
def interpreted_accesses_stay_in_bounds(monkeypatch):
    """Every load and store an interpreted kernel makes (in its active lanes) must address the
    memory of one of its tensor arguments: on a GPU anything else is an illegal address.
    Wraps Triton's interpreter (internal API); without it the check is skipped."""
    import numpy as np
    from aotc.runtime import interpret
    builder = getattr(getattr(triton.runtime, "interpreter", None), "InterpreterBuilder", None)
    if builder is None or not hasattr(builder, "create_masked_load"):
        yield
        return
    ranges: list = []

    def check(ptrs, mask, what):
        if not ranges:
            return
        addr = ptrs.data.astype(np.uint64)
        active = addr if mask is None else addr[np.broadcast_to(mask.data.astype(bool),
                                                                addr.shape)]
        inside = np.zeros(active.shape, bool)
        for lo, hi in ranges[-1]:
            inside |= (active >= lo) & (active < hi)
        assert inside.all(), f"an interpreted kernel {what}s outside its tensors"

    load, store = builder.create_masked_load, builder.create_masked_store
    monkeypatch.setattr(builder, "create_masked_load", lambda self, p, m, *a: (
        check(p, m, "load"), load(self, p, m, *a))[1])
    monkeypatch.setattr(builder, "create_masked_store", lambda self, p, v, m, *a: (
        check(p, m, "store"), store(self, p, v, m, *a))[1])
    if hasattr(builder, "create_load"):   # unmasked accesses (every lane is active)
        plain_load, plain_store = builder.create_load, builder.create_store
        monkeypatch.setattr(builder, "create_load", lambda self, p, *a: (
            check(p, None, "load"), plain_load(self, p, *a))[1])
        monkeypatch.setattr(builder, "create_store", lambda self, p, v, *a: (
            check(p, None, "store"), plain_store(self, p, v, *a))[1])
    kernel = interpret.InterpretedKernels.kernel

    def checked_kernel(self, name, *signature):
        launch = kernel(self, name, *signature)

        def run(grid, *args):
            storages = [a.untyped_storage() for a in args if isinstance(a, torch.Tensor)]
            ranges.append([(s.data_ptr(), s.data_ptr() + s.nbytes()) for s in storages])
            try:
                return launch(grid, *args)
            finally:
                ranges.pop()
        return run
    monkeypatch.setattr(interpret.InterpretedKernels, "kernel", checked_kernel)
    yield


def interpreted(fn, args, path, **options):
    """Compile `fn` for CUDA and load it to run under Triton's interpreter."""
    p = compile_function(fn, args, path, target=TARGET, **options)
    return aotc.load(p, device="cpu", interpret=True)


def kernel_files(path):
    return sorted(p.name for p in (path / "kernels").iterdir())


# ------------------------------------------------------------------------ (a) cross-compile

@pytest.fixture(scope="module")
def cross(tmp_path_factory):
    """mlp and transformer exported for sm_90 (cached for the module)."""
    out = {}
    for name, x in (("mlp", torch.randn(8, 64)), ("transformer", torch.randn(1, 16, 128))):
        model = SAMPLES[name].build()
        path = aotc.export(model, (x,), tmp_path_factory.mktemp(name) / f"{name}.aotc",
                           target=TARGET)
        out[name] = (model, x, path)
    return out


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_cross_compiled_cubins_and_launch_specs(cross, name):
    _, _, path = cross[name]
    manifest = json.loads((path / "manifest.json").read_text())
    target = manifest["target"]
    assert target["device"] == "cuda" and target["archs"] == ["sm_90"] and not target["portable"]
    native = target["native"]
    assert native["kind"] == "triton" and native["triton"] == triton.__version__
    assert native["kernels"]
    for k in native["kernels"]:
        cubin = (path / f"kernels/{k}.sm_90.cubin").read_bytes()
        assert cubin[:4] == b"\x7fELF"
        assert f"def {k}(" in (path / f"kernels/{k}.py").read_text()
        spec = json.loads((path / f"kernels/{k}.json").read_text())
        arch = spec["archs"]["sm_90"]
        names = [p["name"] for p in arch["params"]]
        assert names[:len(spec["params"])] == [p["name"] for p in spec["params"]]
        assert spec["params"] and all(p["type"] for p in spec["params"])
        assert set(names[len(spec["params"]):]) <= {"global_scratch", "profile_scratch"}
        # the cubin's entry: this kernel's, or the first kernel's of the same shape, whose
        # cubin it is (tests/test_kernel_shapes.py)
        assert arch["symbol"] in native["kernels"] and arch["num_warps"] == spec["num_warps"]
        assert cubin == (path / f"kernels/{arch['symbol']}.sm_90.cubin").read_bytes()
        assert arch["shared"] >= 0 and len(spec["grid"]) == 3
    plan = json.loads((path / "plans/forward.json").read_text())
    kernels = [s for s in plan["steps"] if s["kind"] == "kernel"]
    assert kernels and all(len(s["launch"]["grid"]) == 3 for s in kernels)


def test_several_archs_give_one_cubin_each(tmp_path):
    p = compile_function(lambda x: torch.softmax(x, -1), (torch.randn(4, 8),), tmp_path / "a.aotc",
                         target="cuda:sm_80,sm_90")
    files = kernel_files(p)
    assert files == ["kernel0.json", "kernel0.py", "kernel0.sm_80.cubin", "kernel0.sm_90.cubin"]
    spec = json.loads((p / "kernels/kernel0.json").read_text())
    assert sorted(spec["archs"]) == ["sm_80", "sm_90"]
    assert (p / "kernels" / files[2]).read_bytes() != (p / "kernels" / files[3]).read_bytes()


def test_cross_compiled_cubins_are_reproducible(tmp_path, monkeypatch):
    """Two exports with cold Triton caches give the same bytes: the cubins' line info names
    the artifact's kernels/<name>.py, never the temporary file the source was imported from."""
    fn = lambda x: torch.nn.functional.layer_norm(torch.softmax(x, -1) + 1, (8,))  # noqa: E731
    outs, x = [], torch.randn(4, 8)
    for i in range(2):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / f"cache{i}"))
        outs.append(compile_function(fn, (x,), tmp_path / f"r{i}.aotc",
                                     target=TARGET))
    a, b = [{p.relative_to(o): p.read_bytes() for p in sorted(o.rglob("*")) if p.is_file()}
            for o in outs]
    assert sorted(a) == sorted(b) and any(str(k).endswith(".cubin") for k in a)
    assert [k for k in a if a[k] != b[k]] == []
    assert b"aotc-triton" not in b"".join(v for k, v in a.items() if str(k).endswith(".cubin"))


def test_kernel_source_is_self_contained(tmp_path):
    """A kernel's .py runs on its own under TRITON_INTERPRET=1 (no aotc import needed)."""
    x = torch.randn(6, 40)
    p = compile_function(lambda x: torch.softmax(x * 2, -1), (x,), tmp_path / "s.aotc",
                         target=TARGET)
    spec = json.loads((p / "kernels/kernel0.json").read_text())
    script = textwrap.dedent(f"""
        import importlib.util, sys, torch
        spec = importlib.util.spec_from_file_location("k", sys.argv[1])
        k = importlib.util.module_from_spec(spec); spec.loader.exec_module(k)
        x = torch.randn(6, 40); out = torch.empty(6, 40)
        grid = tuple(eval(g) for g in {spec['grid']!r})
        k.kernel0[grid](x, out, **{spec['constexprs']!r})
        assert not [m for m in sys.modules if m.split(".")[0] == "aotc"], "imported aotc"
        torch.testing.assert_close(out, torch.softmax(x * 2, -1))
        print("ok")
    """)
    env = dict(subprocess_env(), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", script, str(p / "kernels/kernel0.py")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_cli_export_for_cuda_with_dtype(tmp_path):
    out = tmp_path / "mlp16.aotc"
    proc = run_aotc("export", SAMPLES["mlp"].ref, "-i", "4x64", "--target", TARGET,
                    "--dtype", "bf16", "-o", out)
    assert proc.returncode == 0, proc.stderr
    m = aotc.load(out, device="cpu", interpret=True)
    assert m.signature() == "forward(x: bfloat16[4, 64]) -> bfloat16[4, 10]"
    ins, outs = m.recorded_samples()
    # products of 4 bf16 rows are aotc's own kernel (codegen/triton/skinny_mm.py), which sums
    # in another order than ATen's: equal to eager's within bf16's rounding, not bitwise
    assert_matches(m(*ins), outs[0], rtol=1.6e-2, atol=1e-2)


def test_cuda_without_arch_needs_a_gpu_or_a_named_arch(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: `cuda` means its arch")
    with pytest.raises(aotc.UsageError, match="names no GPU architecture"):
        compile_function(torch.sin, (torch.randn(3),), tmp_path / "a.aotc", target="cuda")


def test_cuda_artifact_is_refused_on_cpu_and_interpret_is_checked(cross, tmp_path):
    _, _, path = cross["mlp"]
    with pytest.raises(aotc.TargetError):
        aotc.load(path, device="cpu")
    with pytest.raises(aotc.UsageError, match="CPU tensors"):
        aotc.load(path, device="cuda", interpret=True)
    cpu = compile_function(torch.sin, (torch.randn(3),), tmp_path / "c.aotc")
    with pytest.raises(aotc.UsageError, match="holds C\\+\\+ kernels"):
        aotc.load(cpu, interpret=True)


def test_interpret_leaves_the_environment_as_it_was(cross):
    before = os.environ.get("TRITON_INTERPRET")
    aotc.load(cross["mlp"][2], device="cpu", interpret=True)
    assert os.environ.get("TRITON_INTERPRET") == before


# ------------------------------------------------------------------- (b) interpreter numerics

_g = torch.Generator().manual_seed(0)
_x, _y = torch.randn(8, 33, generator=_g), torch.randn(8, 33, generator=_g)
_x3 = torch.randn(4, 6, 10, generator=_g)
_w, _b = torch.randn(33, generator=_g), torch.randn(33, generator=_g)
# sums over thousands of elements differ from eager's in the order of additions
LOOSE = {"long_rows_looped": dict(rtol=1e-5, atol=1e-4)}
PATTERNS = {
    "pointwise_chain": (lambda x: torch.tanh(x * 2 + 1).relu() - x.exp() / 3, (_x,)),
    "softmax": (lambda x: torch.softmax(x, -1), (_x,)),
    "log_softmax_dim0": (lambda x: torch.log_softmax(x, 0), (_x,)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (33,), w, b), (_x, _w, _b)),
    "residual_layer_norm": (lambda x, y, w, b: F.layer_norm(x + y, (33,), w, b),
                            (_x, _y, _w, _b)),
    "sum_last": (lambda x: x.sum(-1), (_x3,)),
    "sum_middle": (lambda x: x.sum(1), (_x3,)),
    "mean_first": (lambda x: x.mean(0), (_x3,)),
    "amax_middle": (lambda x: x.amax(1), (_x3,)),
    "amin_all": (lambda x: x.amin(), (_x3,)),
    "argmax_last": (lambda x: x.argmax(-1), (_x3,)),
    "argmin_middle": (lambda x: x.argmin(1), (_x3,)),
    "var_mean": (lambda x: torch.var_mean(x, -1), (_x3,)),
    "prod_any_all": (lambda x: (x.prod(-1), (x > 1).any(-1), (x > -3).all(1)), (_x3,)),
    "nan_propagation": (lambda x: (x.amax(-1), x.argmax(-1), torch.maximum(x, x.flip(1))),
                        (torch.tensor([[1., float("nan"), 3.], [2., 5., -1.]]),)),
    "long_rows_looped": (lambda x: (torch.softmax(x, -1), x.sum(-1), x.argmin(-1),
                                    torch.var(x, -1)), (torch.randn(3, 5000, generator=_g),)),
    "embedding": (lambda t, i: F.embedding(i, t), (torch.randn(20, 7, generator=_g),
                                                   torch.randint(0, 20, (3, 5), generator=_g))),
    "index_negative": (lambda x, i: x[i] * 2, (_x, torch.tensor([3, -1, 0, 7]))),
    "gather": (lambda x, i: torch.gather(x, 1, i),
               (_x, torch.randint(0, 33, (8, 4), generator=_g))),
    "cat": (lambda x, y: torch.cat([x, y * 2, x[:, :3]], 1), (_x, _y)),
    "pad": (lambda x: F.pad(x, (2, 3, 1, 0), value=1.5), (_x,)),
    "rotate_half": (lambda x: torch.cat((-x[..., 16:], x[..., :16]), -1) * 2,
                    (torch.randn(2, 4, 32, generator=_g),)),
    "masked_fill_where": (lambda x: x.masked_fill(x > 0.5, -1.0).where(x < 1, x * 3), (_x,)),
    "casts_fp16_bf16": (lambda x: (x.half() * 3).float() + x.to(torch.bfloat16).sin().float(),
                        (_x,)),
    "bf16_layer_norm": (lambda x, w, b: F.layer_norm(x, (33,), w, b),
                        (_x.bfloat16(), _w.bfloat16(), _b.bfloat16())),
    "fp16_softmax": (lambda x: torch.softmax(x, -1), (_x.half(),)),
    "integer_ops": (lambda a, b: (a // b, a % b, a * b + 3, (a << 2) ^ b, a.pow(2)),
                    (torch.randint(-50, 50, (6, 7), generator=_g),
                     torch.randint(1, 9, (6, 7), generator=_g))),
    "float_ops": (lambda a, b: (torch.fmod(a, b), torch.remainder(a, b), a // b,
                                torch.atan2(a, b), torch.pow(a.abs(), b), a.round(), a.trunc(),
                                torch.hypot(a, b), torch.sign(a), a.pow(3)), (_x * 5, _y)),
    "arange": (lambda x: x + torch.arange(33), (_x,)),
    "activations": (lambda x: F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x)
                    + F.softplus(x) + F.hardswish(x), (_x,)),
    "constant_reduction": (lambda x: x + torch.ones(8, 33).sum(-1, keepdim=True), (_x,)),
    "zero_d_and_empty": (lambda a, e: (a * 2 + 1, e.exp(), e.sum(-1)),
                         (torch.tensor(2.0), torch.randn(3, 0))),
    "non_contiguous_input": (lambda x: torch.softmax(x, -1), (_x.t(),)),
    "float64": (lambda x: torch.softmax(x * 1.1, -1) + x.exp(), (_x.double(),)),
    "uint8": (lambda a: (a * 3 + 1) // 2, (torch.randint(0, 50, (4, 5), dtype=torch.uint8,
                                                         generator=_g),)),
    "pooling": (lambda x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2, padding=1)[..., :4, :4],
                (torch.randn(2, 3, 8, 8, generator=_g),)),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_matches_eager_through_the_interpreter(name, tmp_path):
    fn, args = PATTERNS[name]
    m = interpreted(fn, args, tmp_path / f"{name}.aotc")
    exact = not any(a.dtype in (torch.float16, torch.bfloat16) for a in args)
    tol = LOOSE.get(name, dict(rtol=1e-5, atol=1e-5) if exact else dict(rtol=1e-2, atol=1e-2))
    torch.testing.assert_close(m(*args), fn(*args), equal_nan=True, **tol)


def test_loads_a_select_drops_are_masked_and_checked(tmp_path, monkeypatch):
    """Two layers keep a dropped arm's address from being dereferenced: `masked` narrows the
    loads inside it, and every load not provably in bounds gets a bounds mask. `cat` (the llama
    rotary embedding, which crashed a GPU) is correct with either layer alone, and with both
    layers removed the interpreter's bounds check catches the stray read: so neither is dead."""
    from aotc.codegen.triton.kernel import TritonHandler

    def unmasked_select(self, mask, fn, other, dtype):   # a select that computes both arms
        other = other if hasattr(other, "expr") else self.constant(other, dtype)
        value = self.to_dtype(fn(), dtype)
        return self._var(f"tl.where({mask.expr}, {value.expr}, {other.expr})", dtype,
                         mask.axes | value.axes | other.axes)
    fn, args = PATTERNS["rotate_half"]
    no_proof = ("aotc.codegen.triton.kernel.in_bounds", lambda *a: True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TritonHandler, "masked", unmasked_select)
        m = interpreted(fn, args, tmp_path / "bounds_mask_only.aotc")
        torch.testing.assert_close(m(*args), fn(*args))
        assert "< 256)" in (tmp_path / "bounds_mask_only.aotc/kernels/kernel0.py").read_text()
        mp.setattr(*no_proof)
        m = interpreted(fn, args, tmp_path / "unmasked.aotc")
        with pytest.raises(Exception, match="outside its tensors"):
            m(*args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(*no_proof)
        m = interpreted(fn, args, tmp_path / "select_mask_only.aotc")
        torch.testing.assert_close(m(*args), fn(*args))


def test_dynamic_sizes_and_out_of_range_indices(tmp_path):
    from torch.export import Dim

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.ln = torch.nn.Embedding(50, 16), torch.nn.LayerNorm(16)

        def forward(self, ids, x):
            h = self.emb(ids) + x
            return torch.softmax(self.ln(h), -1).sum(1), h.amax(-1)

    model = M().eval()
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=2, max=512)
    p = aotc.export(model, (torch.randint(0, 50, (3, 7)), torch.randn(3, 7, 16)),
                    tmp_path / "dyn.aotc", target=TARGET,
                    dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    src = (p / "kernels/kernel0.py").read_text()
    spec = json.loads((p / "kernels/kernel0.json").read_text())
    # at the declared maxima every buffer fits 2**31 elements: 32-bit index arithmetic
    assert "s_batch" in src and "tl.program_id(0).to(tl.int64)" not in src
    assert {q["type"] for q in spec["params"] if q["name"].startswith("s_")} == {"i32"}
    # a second cubin for sizes divisible by 16 (aligned rows: vectorized loads), same params
    div16 = spec["archs"]["sm_90"]["div16"]
    assert div16["cubin"] == "kernels/kernel0.sm_90.div16.cubin" and (p / div16["cubin"]).exists()
    assert div16["params"] == spec["archs"]["sm_90"]["params"]
    assert div16["sizes"] == ["s_seq"]      # batch only counts rows: batch 1 takes it too
    wide = aotc.export(model, (torch.randint(0, 50, (3, 7)), torch.randn(3, 7, 16)),
                       tmp_path / "wide.aotc", target=TARGET, dynamic_shapes=(
                           {0: Dim("batch", min=1, max=2**20), 1: Dim("seq", min=2, max=2**12)},
                           {0: Dim("batch", min=1, max=2**20), 1: Dim("seq", min=2, max=2**12)}))
    assert "tl.program_id(0).to(tl.int64)" in (wide / "kernels/kernel0.py").read_text()
    spec = json.loads((wide / "kernels/kernel0.json").read_text())
    assert {q["type"] for q in spec["params"] if q["name"].startswith("s_")} == {"i64"}
    if OLD_INTERPRETER:
        pytest.skip("Triton < 3.9's interpreter cannot loop to a size argument under NumPy 2")
    m = aotc.load(p, device="cpu", interpret=True)
    for b, s in ((3, 7), (1, 2)):
        ids, x = torch.randint(0, 50, (b, s)), torch.randn(b, s, 16)
        torch.testing.assert_close(m(ids, x), eager(model, (ids, x)))
    bad = ids.clone()
    bad[0, 1] = 77
    with pytest.raises(aotc.GuardError, match=r"holds index 77 .*outside \[0, 49\]"):
        m(bad, x)
    torch.testing.assert_close(m(ids, x), eager(model, (ids, x)))   # the next call is clean


def test_dynamic_permute_divides_by_a_product(tmp_path):
    """Row variables of a dynamic permute divide by products of sizes (xindex // (4 * s_seq))."""
    from torch.export import Dim

    class M(torch.nn.Module):
        def forward(self, x):
            b, s, _ = x.shape
            return x.view(b, s, 4, 8).transpose(1, 2).contiguous() * 2

    p = aotc.export(M(), (torch.randn(2, 5, 32),), tmp_path / "perm.aotc", target=TARGET,
                    dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    m = aotc.load(p, device="cpu", interpret=True)
    for s in (3, 9):
        x = torch.randn(2, s, 32)
        torch.testing.assert_close(m(x), M()(x))


def test_index_printing_parenthesizes_products():
    import sympy
    from aotc.codegen.ir import FloorDiv, ModIndex, size_symbol
    from aotc.codegen.triton.printer import texpr
    x, s = sympy.Symbol("xindex", integer=True, nonnegative=True), size_symbol("seq")
    assert texpr(FloorDiv(x, 4 * s)) == "(xindex // (4 * s_seq))"
    assert texpr(ModIndex(FloorDiv(x, 4), s)) == "((xindex // 4) % s_seq)"
    assert eval(texpr(FloorDiv(x, 4 * s)), {"xindex": 100, "s_seq": 3}) == 100 // 12


def test_static_kernels_index_in_int32(tmp_path):
    p = compile_function(lambda x: torch.softmax(x, -1), (_x,), tmp_path / "s.aotc",
                         target=TARGET)
    assert "int64" not in (p / "kernels/kernel0.py").read_text().split("def kernel0")[1]


def test_golden_lines_of_emitted_triton(tmp_path):
    p = compile_function(lambda x, w, b: torch.softmax(F.layer_norm(x, (33,), w, b), -1),
                         (_x, _w, _b), tmp_path / "g.aotc", target=TARGET)
    src = (p / "kernels/kernel0.py").read_text().split("def kernel0")[1]
    assert src.count("tl.store(") == 1                # statistics stay in registers
    assert "keep_dims=True" in src and "aotc_maximum" in src
    assert "rmask" in src and "tl.debug_barrier" not in src
    spec = json.loads((p / "kernels/kernel0.json").read_text())
    assert spec["constexprs"]["XBLOCK"] >= 1 and spec["num_warps"] in (1, 2, 4, 8)


def test_in_kernel_store_then_read_has_a_barrier(tmp_path):
    """A node reading what an earlier node of its kernel stored waits at a block barrier."""
    from aotc.codegen.ir import (Buffer, ComputedBuffer, Op, Pointwise, Reduction,
                                 ReductionType, sym)
    from aotc.codegen.scheduler import Kernel
    from aotc.codegen.triton import module_text
    from aotc.codegen.triton.kernel import kernel_source
    from aotc.runtime.interpret import import_kernel
    f32, n = torch.float32, sym(16)
    buf = lambda name, shape: Buffer(name=name, slot=0, shape=tuple(map(sym, shape)),
                                     stride=tuple(map(sym, (64, 1)[-len(shape):])), dtype=f32)
    x, a, r = buf("buf0", (16, 64)), buf("buf1", (16, 64)), buf("buf2", (16,))
    exp = ComputedBuffer(buffers=(a,), body=Pointwise(
        ranges=(n, sym(64)), dtype=f32, inner_fn=lambda h, i: h.op(Op.EXP, x.loader()(h, i))))
    total = ComputedBuffer(buffers=(r,), body=Reduction(
        ranges=(n,), reduction_ranges=(sym(64),), reduction_type=ReductionType.SUM, dtype=f32,
        inner_fn=lambda h, i, ri: a.loader()(h, (i[0], ri[0]))))
    k = Kernel(name="kernel0", prefix=(n,), nodes=[exp, total])
    ks = kernel_source(k, {b.name: b for b in (x, a, r)}, {"buf1", "buf2"})
    assert "tl.debug_barrier()" in ks.text
    (tmp_path / "kernel0.py").write_text(module_text(ks))
    fn = import_kernel(module_text(ks), "kernel0", "kernel0.py")
    xs, outa, outr = torch.randn(16, 64), torch.empty(16, 64), torch.empty(16)
    fn[tuple(int(g) for g in ks.grid)](xs, outa, outr, **ks.constexprs)
    torch.testing.assert_close(outr, xs.exp().sum(-1))


def test_every_ir_op_has_a_triton_spelling():
    from aotc.codegen.triton.printer import LIBDEVICE_FUNCTIONS, op_expr
    from aotc.runtime.interpret import _libdevice
    for op in UNARY | BINARY | TERNARY:
        n = 3 if op in TERNARY else 2 if op in BINARY else 1
        assert op_expr(op, ["a", "b", "c"][:n], [torch.float32] * n, torch.float32)
    assert LIBDEVICE_FUNCTIONS <= set(vars(_libdevice()))


def _opinfo_params():
    try:
        import opinfo_cases as oc
    except ImportError:
        return []
    return [pytest.param(n, d, id=f"{n}-{oc._dt(d)}") for n, d, slow in oc.all_cases()
            if not slow]


@pytest.mark.slow
@pytest.mark.parametrize("name,dtype", _opinfo_params())
def test_opinfo_case_through_the_interpreter(name, dtype, tmp_path):
    """The OpInfo cases of test_opinfo.py (C++ backend), compiled for CUDA and interpreted."""
    import opinfo_cases as oc
    b = oc.batch(name, dtype)
    if not b.outputs_of:
        pytest.skip("no usable samples")
    m = interpreted(oc.once_per_call(b.fn), b.inputs, tmp_path / "case.aotc")
    got = m(*b.inputs)
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    with torch.no_grad():
        want = b.fn(*b.inputs)
    problems = [f"{desc} output {k - first}: {msg}" for desc, first, n in b.outputs_of
                for k in range(first, first + n)
                if (msg := oc.compare(got[k], want[k], (name, dtype)))]
    assert not problems, "\n".join(problems[:5])


def test_interpreted_bf16_products_and_casts_are_a_gpus(tmp_path):
    """Triton's interpreter multiplies bf16 blocks' raw bits in tl.dot and truncates float32
    to bf16; aotc's interpret=True mends both while its launches run (runtime/interpret.py).
    With small integers every sum is exact in float32, so the hand-written product kernel's
    bf16 results must equal eager's bit for bit: only the final rounding (to nearest even)
    is left, and values past 256 need it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-8, 9, (8, 32), generator=g).to(torch.bfloat16)
    w = torch.randint(-8, 9, (64, 32), generator=g).to(torch.bfloat16)
    fn = lambda x, w: x @ w.t()   # noqa: E731
    m = aotc.load(compile_function(fn, (x, w), tmp_path / "p.aotc", target=TARGET),
                  device="cpu", interpret=True)
    got, want = m(x, w), fn(x, w)
    assert want.abs().max() > 256 and torch.equal(got, want)
