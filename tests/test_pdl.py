"""Programmatic dependent launch: sm_90+ cubins wait for their predecessor first and are launched
with programmatic stream serialization; older archs and the interpreter never see either."""
from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace

import pytest
import torch

import aotc
import aotc.artifact.reader  # noqa: F401 - aotc.artifact.reader.Artifact below
from aotc.errors import ArtifactError
from conftest import SAMPLES
from hostile import assert_refused, copy_artifact, edit_json

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def two_archs(tmp_path_factory):
    model = SAMPLES["mlp"].build()
    path = tmp_path_factory.mktemp("p") / "p.aotc"
    return aotc.export(model, (torch.randn(8, 64),), path, target="cuda:sm_80,sm_90")


def _specs(path):
    from aotc.artifact import format as fmt
    from aotc.artifact.reader import Artifact
    art = Artifact(path)
    names = art.manifest.target.native.kernels
    return art, {n: art.read(fmt.triton_launch_file(n)) for n in names}


def test_sm90_builds_wait_for_their_predecessor_and_sm80_ones_do_not(two_archs):
    import json
    art, specs = _specs(two_archs)
    assert specs, "the MLP has generated kernels"
    for name, raw in specs.items():
        spec = json.loads(raw)
        assert spec["archs"]["sm_90"].get("pdl") is True, name
        assert "pdl" not in spec["archs"]["sm_80"], name
        text = art.read(f"kernels/{name}.py").decode()
        head = text[text.index(f"def {name}("):]
        assert "AOTC_PDL: tl.constexpr = False):" in head.splitlines()[0]
        body = [ln.strip() for ln in head.splitlines()[1:] if not ln.strip().startswith("#")]
        assert body[:2] == ["if AOTC_PDL:", "tl.extra.cuda.gdc_launch_dependents()"], name
        assert body.count("tl.extra.cuda.gdc_wait()") == 1, name


def _constant_slots(plan) -> set[str]:
    from aotc.artifact.schema.types import SlotKind, StepKind
    out = {f"buf{i}" for i, s in enumerate(plan.slots) if s.kind is SlotKind.WEIGHT}
    for step in plan.steps:
        if step.kind is StepKind.VIEW and {f"buf{r}" for r in step.reads()} <= out:
            out |= {f"buf{o}" for o in step.out if o is not None}
    return out


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    from conftest import llama_sample
    model = llama_sample(hidden=160)
    path = tmp_path_factory.mktemp("d") / "d.aotc"
    return aotc.export(model, (torch.randint(0, 500, (1, 8)),), path, decode=True,
                       max_cache_len=32, target="cuda:sm_90", dtype="bf16")


def _unwritten_state(plan) -> dict[str, set[str]]:
    """{kernel name: the state slots no step before it in the plan writes or views}."""
    from aotc.artifact.schema.types import SlotKind, StepKind
    state = {f"buf{i}" for i, s in enumerate(plan.slots) if s.kind is SlotKind.STATE}
    touched, out = set(), {}
    for step in plan.steps:
        if step.kind is StepKind.KERNEL:
            out[step.name] = state - touched
            touched |= {f"buf{o}" for o in step.out if o is not None}
        elif step.kind is not StepKind.FREE:
            touched |= {f"buf{r}" for r in step.reads()} & state
            touched |= {f"buf{o}" for o in (step.out or []) if o is not None}
    return out


def test_only_weights_and_unwritten_state_are_read_before_the_wait(decoder):
    # before a kernel waits for its predecessor it may read what no kernel writes (weights and
    # views of them) and compute indices; never a value another kernel writes, never a store.
    # The decode attention kernels also read the position and the caches there, which no
    # kernel of the step before them writes (codegen/lowering/decode.py)
    import re
    art = aotc.artifact.reader.Artifact(decoder)
    plan = art.plan("decode")
    constants, unwritten = _constant_slots(plan), _unwritten_state(plan)
    early = attention = 0
    for name in art.manifest.target.native.kernels:
        text = art.read(f"kernels/{name}.py").decode()
        lines = text[text.index(f"def {name}("):].splitlines()[1:]
        code = [ln for ln in lines if not ln.strip().startswith("#")]
        wait = code.index("        tl.extra.cuda.gdc_wait()")
        before = "\n".join(code[:wait - 1])
        assert "tl.store" not in before and "aotc_err" not in before, name
        named = set(re.findall(r"\bbuf\d+\b", before))
        state = named - constants
        if name.startswith("decode_"):
            assert state <= unwritten.get(name, set()), (name, state)
            attention += bool(state)
        else:
            assert not state, (name, state)
        early += bool(named)
    assert early >= 2 * 3, "the q/k/v, gate/up and output products of each layer load early"
    assert attention >= 2 * 2, "each layer's split and combine kernels read the state early"


def test_computed_attention_operands_read_position_and_tables_before_the_wait(decoder):
    # the split kernel computes the rotary q and key itself (codegen/triton/prologue.py): the
    # position, its table rows and the index arithmetic run before the wait, the loads of the
    # q/k/v product's rows after it
    art = aotc.artifact.reader.Artifact(decoder)
    split = 0
    for name in art.manifest.target.native.kernels:
        text = art.read(f"kernels/{name}.py").decode()
        if "    q_value = " not in text:
            continue
        split += 1
        wait = text.index("gdc_wait()")
        assert text.count("q_value_tmp", 0, wait) and text.count("key_value_tmp", 0, wait)
        assert " = tl.load(" in text[wait:text.index("    q_value = ")]
    assert split >= 2, "one split kernel a layer computes q and the key"


def test_few_program_kernels_hoist_weights_up_to_their_first_loop():
    from types import SimpleNamespace as NS

    from aotc.codegen.triton.build import PDL_WAIT, pdl_body
    buffers = {"buf1": NS(constant=True), "buf2": NS(constant=True), "buf9": NS(constant=False)}
    body = ["x = tl.arange(0, 64)[None, :]", "a = tl.load(buf9 + x)", "w = tl.load(buf1 + x)",
            "for r in range(0, 4096, 64):", "    acc = acc + tl.load(buf9 + r + x)",
            "u = tl.load(buf2 + x)"]
    wait = PDL_WAIT[1]
    one = pdl_body(body, buffers, ["1", "1", "1"])
    assert one[one.index(wait) - 2] == "w = tl.load(buf1 + x)"
    assert one[-1] == "u = tl.load(buf2 + x)"                # not across the loop
    many = pdl_body(body, buffers, ["64", "1", "1"])      # bound by bytes: the prefix only
    assert many[many.index(wait) + 1:many.index(wait) + 3] == body[1:3]


def test_hoisting_before_the_wait_keeps_every_value():
    from aotc.codegen.triton.build import hoist_early
    lines = ["a = tl.load(buf1)",            # a weight: early
             "y = tl.load(buf2) + x",        # a kernel's output: late (reads outer x)
             "c = a * 2",
             "tl.store(aotc_err + 0, 3, c)",  # stores stay after the wait
             "x = c + 1",                    # would change what the late y read: late
             "d = c + 1",
             "c = y",                        # reassigns c: late
             "e = c + d",                    # reads the late c: late
             "f = tl.load(buf3 + d)"]        # buf3 is not early: late
    before, after = hoist_early(lines, {"buf1"})
    assert before == ["a = tl.load(buf1)", "c = a * 2", "d = c + 1"]
    assert after == [ln for ln in lines if ln not in before]


def test_one_row_products_load_their_weights_before_the_wait(decoder):
    # products reading a stored x, and products computing their x's norm first
    # (codegen/lowering/row_statistics.py), whose statistics wait: the first product's weights
    # go before the wait either way
    art = aotc.artifact.reader.Artifact(decoder)
    constants = _constant_slots(art.plan("decode"))
    products = normed = 0
    for name in art.manifest.target.native.kernels:
        body = art.read(f"kernels/{name}.py").decode()
        body = body[body.index(f"def {name}("):]
        head = body.splitlines()[1]
        if not name.startswith("decode_") or not ("matvec" in head or "per_row" in head):
            continue
        wait = body.index("gdc_wait()")
        early = set(re.findall(r"tl\.load\((buf\d+)", body[:wait]))
        assert early and early <= constants, (name, early)
        products += 1
        normed += "per_row" in head
    assert products >= 2 * 4 and normed >= 2 * 2, (products, normed)


def test_hand_written_kernels_take_the_wait_too():
    from aotc.codegen.triton.build import PDL_LINES, with_pdl
    text = "@triton.jit\ndef k(a, b):\n    x = tl.load(a)\n"
    out = with_pdl(text, "k")
    assert out.splitlines()[1] == "def k(a, b, AOTC_PDL: tl.constexpr = False):"
    assert [ln.strip() for ln in out.splitlines()[2:5]] == [ln.strip() for ln in PDL_LINES]
    with pytest.raises(aotc.LoweringError, match="one-line def"):
        with_pdl("def k(a,\n      b):\n", "k")


def test_the_interpreter_runs_them_without_the_wait(two_archs):
    x = torch.randn(8, 64)
    model = SAMPLES["mlp"].build()
    got = aotc.load(two_archs, device="cpu", interpret=True)(x)
    torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)


def test_pdl_must_be_a_boolean(two_archs, tmp_path):
    from aotc.artifact import format as fmt
    art = copy_artifact(two_archs, tmp_path / "a.aotc")
    edit_json(art, fmt.triton_launch_file("kernel0"),
              lambda s: s["archs"]["sm_90"].update({"pdl": "yes"}))
    err = assert_refused(art, tmp_path / "PWNED", ArtifactError, device="cpu", interpret=True)
    assert "pdl" in err.where and "kernels/kernel0.json" in err.where


class FakeLib:
    def __init__(self, refuse: bool = False):
        self.calls, self.refuse = [], refuse

    def cuLaunchKernelEx(self, config, fn, params, extra):
        c = config._obj
        attr = c.attrs[0]
        self.calls.append(("ex", tuple(c.grid), tuple(c.block), c.shared, c.stream, c.count,
                           attr.id, attr.value, fn))
        return 801 if self.refuse else 0    # CUDA_ERROR_NOT_SUPPORTED

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.calls.append(("plain", (gx, gy, gz), (bx, by, bz), shared, stream.value, fn))
        return 0


def _launcher(monkeypatch, pdl: bool, env: str | None, refuse: bool = False):
    from aotc.runtime import cuda
    from aotc.artifact.schema.launch import Build, Param
    if env is not None:
        monkeypatch.setenv("AOTC_CUDA_PDL", env)
    lib = FakeLib(refuse)
    fake = SimpleNamespace(lib=lib, launch_ex=lib.cuLaunchKernelEx,
                           make_current=lambda ctx: None, check=lambda what, s: None)
    monkeypatch.setattr(cuda, "driver", lambda: fake)
    monkeypatch.setattr(cuda, "current_stream", lambda index: 1234)
    build = Build(cubin="k.cubin", symbol="k", shared=64, num_warps=2, num_ctas=1, pdl=pdl,
                  params=(Param(name="buf0", type="*fp32"), Param(name="s_n", type="i32")))
    owner = SimpleNamespace(device=torch.device("cuda", 0), context=None)
    launcher = cuda.CudaLauncher("k", 77, None, build, SimpleNamespace(inputs=()), owner)
    return launcher, lib


@pytest.mark.parametrize("pdl,env,kind", [(True, None, "ex"), (True, "0", "plain"),
                                          (False, None, "plain")])
def test_launch_path(monkeypatch, pdl, env, kind):
    from aotc.runtime.cuda import CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION as ATTR
    launcher, lib = _launcher(monkeypatch, pdl, env)
    launcher((3, 2, 1), torch.empty(4), 4)
    (call,) = lib.calls
    assert call[0] == kind and call[1] == (3, 2, 1) and call[2] == (64, 1, 1)
    assert call[3] == 64 and call[4] == 1234
    if kind == "ex":
        assert call[5:] == (1, ATTR, 1, 77)


def test_a_driver_refusing_the_attribute_gets_plain_launches(monkeypatch):
    launcher, lib = _launcher(monkeypatch, True, None, refuse=True)
    launcher((1, 1, 1), torch.empty(4), 4)
    launcher((1, 1, 1), torch.empty(4), 4)
    assert [c[0] for c in lib.calls] == ["ex", "plain", "plain"]


def test_launch_structs_match_the_driver_abi():
    from aotc.runtime.cuda import LaunchAttribute, LaunchConfig
    assert ctypes.sizeof(LaunchAttribute) == 72            # id, pad to 8, a 64-byte union
    assert (LaunchConfig.stream.offset, LaunchConfig.attrs.offset,
            LaunchConfig.count.offset, ctypes.sizeof(LaunchConfig)) == (32, 40, 48, 56)
