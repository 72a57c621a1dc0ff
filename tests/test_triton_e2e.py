"""The Triton backend without a GPU, end to end (split from test_triton.py, whose interpreter
bounds check and helpers it reuses): (c) the samples and suite models at small sizes through
Triton's interpreter, training artifacts for CUDA, and units of the GPU path that need no GPU
(arch choice, parameter packing), plus GPU-only tests (marked `gpu`, skipped without one).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import aotc
from conftest import SAMPLES, SAMPLES_DIR, assert_matches, eager, import_file
from test_triton import (TARGET, cross, interpreted_accesses_stay_in_bounds,  # noqa: F401
                         needs_gpu)

triton = pytest.importorskip("triton")


# ----------------------------------------------------------------------- (c) end-to-end samples

SMALL = {"mlp": lambda: (torch.randn(4, 64),), "cnn": lambda: (torch.randn(1, 3, 16, 16),),
         "transformer": lambda: (torch.randn(1, 16, 128),),
         "gpt2": lambda: (torch.randint(0, 1000, (1, 16)),)}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_sample_matches_eager_through_the_interpreter(name, tmp_path):
    torch.manual_seed(0)
    model, inputs = SAMPLES[name].build(), SMALL[name]()
    p = aotc.export(model, inputs, tmp_path / f"{name}.aotc", target=TARGET)
    m = aotc.load(p, device="cpu", interpret=True)
    assert_matches(m(*inputs), eager(model, inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["distilbert", "llama", "t5", "vit"])
def test_suite_model_matches_eager_through_the_interpreter(name, tmp_path):
    """The benchmark suite's transformers models (small configs), exported for sm_90, with
    every generated Triton kernel run by the interpreter: fp32 numerics of the kernels the H200
    runs for them (its benchmark checks bf16)."""
    pytest.importorskip("transformers")
    sys.path.append(str(Path(__file__).resolve().parents[1]))   # `benchmarks`, from the tree
    from benchmarks import models
    spec, = [s for s in models.REGISTRY if s.name == name]
    model, inputs = spec.make("small", "latency")
    p = aotc.export(model, inputs, tmp_path / f"{name}.aotc", target=TARGET)
    m = aotc.load(p, device="cpu", interpret=True)
    assert_matches(m(*inputs), eager(model, inputs), rtol=1e-4, atol=1e-4)


# A training artifact for CUDA: forward and backward plans both compiled to Triton kernels;
# gradients of every parameter and of the input match eager's through the interpreter.
TRAIN = {"mlp": lambda: (import_file(SAMPLES_DIR / "mlp.py").Net(), torch.randn(8, 64)),
         "transformer": lambda: (import_file(SAMPLES_DIR / "transformer.py").Net(layers=1),
                                 torch.randn(1, 16, 128))}


@pytest.mark.parametrize("name", ["mlp", "transformer"])   # 3 s and 7-10 s
def test_training_artifact_for_cuda_through_the_interpreter(name, tmp_path):
    import copy
    torch.manual_seed(0)
    model, x = TRAIN[name]()
    ref = copy.deepcopy(model).train()
    p = aotc.export(model, (x,), tmp_path / f"{name}.aotc", train=True, target=TARGET)
    for entry in ("forward", "backward"):
        plan = json.loads((p / "plans" / f"{entry}.json").read_text())
        launched = [s for s in plan["steps"] if s["kind"] == "kernel" and "launch" in s]
        assert launched, f"{entry}: no Triton kernel"
        assert all(s["name"].startswith(f"{entry}_") for s in launched)
        assert all((p / "kernels" / f"{s['name']}.sm_90.cubin").is_file() for s in launched)
    m = aotc.load(p, device="cpu", interpret=True)
    g = torch.Generator().manual_seed(1)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_a, out_b = m(xa), ref(xb)
    assert_matches(out_a, out_b, rtol=1e-4, atol=1e-4)
    flat = lambda o: [o] if isinstance(o, torch.Tensor) else list(o.values())   # noqa: E731
    weights = [torch.randn(o.shape, generator=g) for o in flat(out_b)]
    sum((o * w).sum() for o, w in zip(flat(out_a), weights)).backward()
    sum((o * w).sum() for o, w in zip(flat(out_b), weights)).backward()
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for (n, a), (_, b) in zip(m.named_parameters(), ref.named_parameters()):
        assert a.grad is not None, n
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=lambda s: f"{n}: {s}")
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)


# -------------------------------------------------------------- the GPU path, without a GPU

def test_arch_choice():
    from aotc.runtime.cuda import select_arch
    assert select_arch(["sm_80", "sm_90"], "sm_90") == "sm_90"
    assert select_arch(["sm_90a"], "sm_90") == "sm_90a"
    assert select_arch(["sm_80"], "sm_86") == "sm_80"           # same major, newer minor
    for built, device in ((["sm_80"], "sm_90"), (["sm_90"], "sm_100"), (["sm_86"], "sm_80")):
        with pytest.raises(aotc.TargetError) as info:
            select_arch(built, device)
        assert built[0] in str(info.value) and device in str(info.value)


def test_launcher_packs_pointers_sizes_and_scratch_in_order():
    import ctypes
    from dataclasses import replace
    from types import SimpleNamespace

    from aotc.runtime.cuda import CudaLauncher, pack
    from aotc.artifact.schema.launch import Build, Param
    meta = Build(cubin="k.cubin", symbol="k", shared=0, num_warps=4, num_ctas=1, params=(
        Param(name="buf0", type="*fp32"), Param(name="buf1", type="*fp32"),
        Param(name="s_n", type="i64"), Param(name="global_scratch", type="scratch"),
        Param(name="profile_scratch", type="scratch")))
    owner = type("Owner", (), {"device": torch.device("cpu")})()
    launcher = CudaLauncher("k", None, None, meta, SimpleNamespace(inputs=("buf0",)), owner)
    assert launcher.threads == 128
    base = torch.zeros(64)
    misaligned, out = base[1:33], torch.empty(32)
    values, keep = launcher._values((2, 1, 1), (misaligned, out, 32))
    assert len(values) == 5 and all(isinstance(v, int) for v in values)
    assert values[0] % 16 == 0 and values[0] != misaligned.data_ptr()    # the input, copied
    assert torch.equal(keep[0], misaligned)
    assert values[1:] == [out.data_ptr(), 32, 0, 0]          # output as is, size, no scratch
    packed, params = pack(values)
    assert [ctypes.c_int64.from_address(params[i]).value for i in range(5)] == values
    CudaLauncher("k", None, None, replace(meta, params=(Param(name="n", type="i32"),)),
                 SimpleNamespace(inputs=()), owner)   # 32-bit sizes: the low half of their slot
    launcher.div16, launcher.aligned = ("fn16", "module16", 256), [2]   # s_n divisible by 16
    assert launcher.function_for(values[:2] + [32] + values[3:]) == ("fn16", 256)
    assert launcher.function_for(values[:2] + [40] + values[3:]) == (None, 0)
    with pytest.raises(aotc.TargetError, match="i16"):
        CudaLauncher("k", None, None, replace(meta, params=(Param(name="n", type="i16"),)),
                     SimpleNamespace(inputs=()), owner)


def test_ptx_parameter_count():
    from aotc.codegen.triton.build import ptx_params
    ptx = ".visible .entry k(\n .param .u64 .ptr .global .align 1 k_param_0,\n" \
          " .param .u32 k_param_1,\n .param .u64 .ptr .global .align 1 k_param_2\n)\n{"
    assert ptx_params(ptx, "k") == 3


@needs_gpu
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_cubins_run_on_the_gpu(cross, name):
    model, x, path = cross[name]
    m = aotc.load(path)
    got = m(x.cuda())
    assert_matches(got, eager(model.cuda(), (x.cuda(),)), rtol=1e-4, atol=1e-4)
    model.cpu()
