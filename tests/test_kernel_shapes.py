"""Kernels of one shape compile once (codegen/triton/build.py): a kernel whose source differs
from an earlier one's only in its name, its buffers' names and the error code it stores (a
decoder's layers) gets that one's cubin, its launch spec naming its own buffers; the runtime
finds the bad index among every step that stores a shared code."""
from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

import aotc
import aotc.artifact.reader
from aotc.runtime.kernels import launch_specs

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    from conftest import llama_sample
    path = tmp_path_factory.mktemp("shapes") / "d.aotc"
    return aotc.export(llama_sample(layers=3), (torch.randint(0, 500, (1, 8)),), path,
                       decode=True, max_cache_len=32, target="cuda:sm_90", dtype="bf16")


def test_a_decoders_layers_share_their_cubins(decoder):
    art = aotc.artifact.reader.Artifact(decoder)
    specs = {n: json.loads(art.read(f"kernels/{n}.json"))
             for n in art.manifest.target.native.kernels}
    groups = defaultdict(list)
    for name, spec in specs.items():
        build = spec["archs"]["sm_90"]
        first = specs[build["symbol"]]          # the cubin's entry: the first of its shape
        groups[build["symbol"]].append(name)
        assert first["archs"]["sm_90"]["symbol"] == build["symbol"]
        assert art.read(build["cubin"]) == art.read(first["archs"]["sm_90"]["cubin"])
        own = [p["name"] for p in spec["params"]]
        assert [p["name"] for p in build["params"]][:len(own)] == own
        assert [p["type"] for p in build["params"]] == \
            [p["type"] for p in first["archs"]["sm_90"]["params"]]
        assert (spec["constexprs"], spec["num_warps"], spec["error_code"]) == \
            (first["constexprs"], first["num_warps"], first["error_code"])
        text = art.read(f"kernels/{name}.py").decode()
        assert f"def {name}({', '.join(own)}," in text   # the source names its own buffers
        # and is, but for names, the source the cubin was compiled from
        assert _numbered(text, name, own) == \
            _numbered(art.read(f"kernels/{build['symbol']}.py").decode(), build["symbol"],
                      [p["name"] for p in first["params"]])
    layered = [g for s, g in groups.items() if s.startswith("decode_") and len(g) == 3]
    assert len(layered) >= 2, groups        # attention: per layer
    # products too, where layers read alike: a product computing its norm reads the residual's
    # terms (codegen/lowering/row_statistics.py), and which are stored varies with the layer
    assert len([g for s, g in groups.items() if s.startswith("decode_") and len(g) >= 2]) >= 4
    coded = [g for g in layered if specs[g[0]]["error_code"]]
    assert coded, ("the attention kernels, which compute the rotary q and key and check the "
                   "position, share a code and a cubin")
    assert len(groups) < 0.7 * len(specs)   # 3 layers; the layers' pattern repeats every 3


def _numbered(text: str, name: str, params: list) -> str:
    """A kernel module's code without its docstring and comments, the kernel and its
    parameters renamed by place."""
    import re
    code = text[text.index('"""', 3) + 3:]
    code = "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith("#"))
    where = {n: f"P{i}" for i, n in enumerate([name, *params])}
    return re.sub(r"\b(" + "|".join(map(re.escape, where)) + r")\b",
                  lambda m: where[m.group(1)], code)


def test_shapes_ignore_names_and_comments_only():
    from aotc.codegen.triton.build import KernelSource, kernel_shape, share_codes

    def source(name, a, b, body="x = tl.load(A)\n    tl.store(B, x * 2)", code=None):
        text = (f"@triton.jit\ndef {name}({a}, {b}, XBLOCK: tl.constexpr):\n    # {a}\n"
                f"    {body.replace('A', a).replace('B', b)}\n")
        return KernelSource(name=name, text=text, ins=[a], outs=[b], sizes=[],
                            signature={a: "*fp32", b: "*fp32"}, constexprs={"XBLOCK": 8},
                            grid=["1", "1", "1"], num_warps=4, error_code=code)
    one, two = source("k0", "buf1", "buf2"), source("k7", "buf40", "buf9")
    assert kernel_shape(one, "sm_90") == kernel_shape(two, "sm_90")
    assert kernel_shape(one, "sm_90") != kernel_shape(one, "sm_80")
    assert kernel_shape(one, "sm_90") != kernel_shape(
        source("k1", "buf1", "buf2", "x = tl.load(A)\n    tl.store(B, x * 3)"), "sm_90")
    swapped = source("k2", "buf1", "buf2", "x = tl.load(B)\n    tl.store(A, x * 2)")
    assert kernel_shape(one, "sm_90") != kernel_shape(swapped, "sm_90")
    check = "x = tl.load(A)\n    bad3 = x < 0\n    tl.store(aotc_err + 0, {}, bad3)"
    c1 = source("k3", "buf1", "buf2", check.format(11), code=11)
    c2 = source("k4", "buf5", "buf6", check.format(12), code=12)
    c3 = source("k5", "buf5", "buf6", check.format(13).replace("< 0", "< 1"), code=13)
    s1, s2, s3 = share_codes([c1, c2, c3])
    assert (s1.error_code, s2.error_code, s3.error_code) == (11, 11, 13)
    assert "aotc_err + 0, 11, bad3" in s2.text and kernel_shape(s1, "") == kernel_shape(s2, "")


class TwoLookups(torch.nn.Module):
    """Two embeddings of one size behind separate products: their gathers are kernels of one
    shape, reading different index inputs, so they store one error code."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Embedding(30, 8), torch.nn.Embedding(30, 8)
        self.wa, self.wb = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, i, j):
        return self.wa(self.a(i) * 2) + self.wb(self.b(j) * 2)


@pytest.mark.parametrize("runner", ["python", "cpp"])
def test_a_shared_code_names_the_input_that_holds_the_bad_index(tmp_path, runner):
    from aotc.runtime.cpp_runner import runner_status
    if runner == "cpp" and runner_status()[0] is None:
        pytest.skip(runner_status()[1])
    model = TwoLookups().eval()
    i, j = torch.randint(0, 30, (4,)), torch.randint(0, 30, (4,))
    path = aotc.export(model, (i, j), tmp_path / "t.aotc", target="cuda:sm_90")
    art = aotc.artifact.reader.Artifact(path)
    codes = [json.loads(art.read(f"kernels/{n}.json"))["error_code"]
             for n in art.manifest.target.native.kernels]
    assert len([c for c in codes if c]) >= 2 and len({c for c in codes if c}) == 1
    m = aotc.load(path, device="cpu", interpret=True, runner=runner)
    torch.testing.assert_close(m(i, j), model(i, j))
    for bad_i, bad_j, name in ((i, torch.tensor([1, 2, 30, 0]), "'j' (#1)"),
                               (torch.tensor([0, -1, 2, 3]), j, "'i' (#0)")):
        with pytest.raises(aotc.GuardError) as e:
            m(bad_i, bad_j)
        assert e.value.where == f"input {name}", e.value


class Blocks(torch.nn.Module):
    """Four blocks of one shape (an encoder's layers, small)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.GELU())
            for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x).softmax(-1)
        return x


def test_cpu_kernels_of_one_shape_are_one_function(tmp_path):
    import re
    model, x = Blocks().eval(), torch.randn(3, 16)
    path = aotc.export(model, (x,), tmp_path / "b.aotc")
    source = (path / "kernels" / "kernels.cpp").read_text()
    defined = set(re.findall(r'^extern "C" int (kernel\d+)\(', source, re.M))
    rows = dict(re.findall(r'\{"(kernel\d+)", \(void\*\)&(kernel\d+),', source))
    assert set(rows.values()) == defined and len(defined) < len(rows) / 2, (defined, rows)
    assert any(name != fn for name, fn in rows.items())
    from aotc.runtime.cpp_runner import runner_status
    for runner in ("python", "cpp") if runner_status()[0] is not None else ("python",):
        m = aotc.load(path, runner=runner)
        for _ in range(2):
            x = torch.randn(3, 16)
            torch.testing.assert_close(m(x), model(x))


def test_a_gpu_loads_each_distinct_cubin_once(decoder, monkeypatch):
    # CudaKernels._function with a driver that counts loads: one module per distinct
    # (cubin, entry), whichever kernels share it
    from aotc.runtime import cuda

    class Driver:
        loads = 0

        def function(self, image, symbol, shared):
            Driver.loads += 1
            return f"module{Driver.loads}", f"fn{Driver.loads}"
    monkeypatch.setattr(cuda, "driver", lambda: Driver())
    art = aotc.artifact.reader.Artifact(decoder)
    kernels = object.__new__(cuda.CudaKernels)
    kernels.artifact, kernels.modules, kernels.loaded = art, [], {}
    specs = launch_specs(art.manifest, art.manifest.target.native.kernels, art.read,
                         art.version)
    got = {n: kernels._function(s.archs["sm_90"][0]) for n, s in specs.items()}
    distinct = {(art.read(s.archs["sm_90"][0].cubin), s.archs["sm_90"][0].symbol)
                for s in specs.values()}
    assert Driver.loads == len(distinct) == len(kernels.modules) < len(specs)
    for n, s in specs.items():
        assert got[n] == got[s.archs["sm_90"][0].symbol]
