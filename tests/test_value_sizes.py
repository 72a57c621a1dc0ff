"""Value-dependent sizes (format 16): x[mask], nonzero, masked_select, .item() in inference
exports. The call that makes such a size binds it (the plan step's `binds`); later kernels and
calls size their buffers with it; both runners and the C++ front end check it against the
range export proved before anything reads it. Training refuses them (typed); hostile plans that
bind or use a size out of order are ArtifactErrors at load.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import aotc
from aotc.errors import ArtifactError, ExportError, GuardError
from aotc.artifact import format as fmt
from conftest import replace_file, run_cpp
from hostile import rederive


class Adapters(torch.nn.Module):
    """X-MOD's language adapters: rows of each language through their own layer, scattered
    back (zero rows of a language is the common case)."""

    def __init__(self, languages: int = 3):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(languages))

    def forward(self, x, lang):
        out = torch.zeros_like(x)
        for i, layer in enumerate(self.layers):
            keep = lang == i
            out[keep] = torch.relu(layer(x[keep])) * 2
        return out + x


class Selected(torch.nn.Module):
    """Outputs whose sizes the values give: nonzero's indices, a gather by them, a mean over
    selected rows, masked_select."""

    def forward(self, x, keep):
        idx = torch.nonzero(x[..., 0] > 0)
        rows = x[keep]
        mean = rows.sum(0) / (rows.shape[0] + 1)
        return idx, x[idx[:, 0], idx[:, 1]] * 2 + 1, mean, torch.masked_select(x[..., 1], keep)


class Prefix(torch.nn.Module):
    """A size read with .item() (an integer result binds it)."""

    def forward(self, x, lengths):
        n = lengths.max().item()
        torch._check(n >= 0)
        torch._check(n <= x.shape[1])
        return x[:, :n].relu() + 1


def _languages(kind: str) -> torch.Tensor:
    if kind == "mixed":
        return torch.randint(0, 3, (2, 8))
    return torch.full((2, 8), {"one": 1, "none": 7}[kind])


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    torch.manual_seed(0)
    model = Adapters().eval()
    x = torch.randn(2, 8, 16)
    path = aotc.export(model, (x, _languages("mixed")), tmp_path_factory.mktemp("v") / "a.aotc")
    return model, path


def _same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("runner", ["cpp", "python"])
@pytest.mark.parametrize("kind", ["mixed", "one", "none"])
def test_selected_rows_through_layers_match_eager(adapters, runner, kind):
    model, path = adapters
    m = aotc.load(path, runner=runner)
    assert m.runtime.startswith(runner)
    x, lang = torch.randn(2, 8, 16), _languages(kind)
    _same(m(x, lang), model(x, lang))
    plan = json.loads((path / fmt.plan_file("forward")).read_bytes())
    assert [s["binds"] for s in plan["steps"] if "binds" in s] == \
        [{"u0": [0, 0]}, {"u1": [0, 0]}, {"u2": [0, 0]}]
    assert "S_u0 = symbols['u0'] = " in m.code


@pytest.mark.parametrize("runner", ["cpp", "python"])
def test_outputs_of_value_dependent_sizes(tmp_path, runner):
    x, keep = torch.randn(3, 5, 4), torch.rand(3, 5) > 0.5
    m = aotc.load(aotc.export(Selected(), (x, keep), tmp_path / "s.aotc"), runner=runner)
    for keep2 in (keep, torch.zeros(3, 5, dtype=torch.bool), torch.ones(3, 5, dtype=torch.bool)):
        x2 = torch.randn(3, 5, 4)
        _same(m(x2, keep2), Selected()(x2, keep2))


def test_dynamic_dims_and_value_dependent_sizes_together(tmp_path):
    seq = torch.export.Dim("seq", min=2, max=64)
    x, keep = torch.randn(3, 5, 4), torch.rand(3, 5) > 0.5
    path = aotc.export(Selected(), (x, keep), tmp_path / "d.aotc",
                       dynamic_shapes=({1: seq}, {1: seq}))
    for runner in ("cpp", "python"):
        m = aotc.load(path, runner=runner)
        for n in (2, 9, 64):
            x2, keep2 = torch.randn(3, n, 4), torch.rand(3, n) > 0.3
            _same(m(x2, keep2), Selected()(x2, keep2))


def test_a_size_read_with_item(tmp_path):
    x = torch.randn(2, 10)
    path = aotc.export(Prefix(), (x, torch.tensor([3, 5])), tmp_path / "p.aotc")
    for runner in ("cpp", "python"):
        m = aotc.load(path, runner=runner)
        for lengths in ([7, 1], [0, 0], [10, 2]):
            _same(m(x, torch.tensor(lengths)), Prefix()(x, torch.tensor(lengths)))
        with pytest.raises(GuardError) as info:   # torch._check said n <= 10
            m(x, torch.tensor([11, 0]))
        assert "u0=11" in str(info.value) and "0 <= u0 <= 10" in info.value.expected


def test_triton_kernels_over_value_dependent_sizes(tmp_path):
    torch.manual_seed(0)
    model, x = Adapters().eval(), torch.randn(2, 8, 16)
    path = aotc.export(model, (x, _languages("mixed")), tmp_path / "c.aotc",
                       target="cuda:sm_90")
    m = aotc.load(path, device="cpu", interpret=True, runner="python")
    for lang in (_languages("mixed"), _languages("none")):
        _same(m(x, lang), model(x, lang))


def test_cuda_graphs_are_off_for_value_dependent_sizes(adapters):
    from aotc.runtime.graphs import GraphedEntry
    entry = aotc.load(adapters[1]).entries["forward"]
    status = GraphedEntry(entry, torch.device("cuda")).status()   # built without a GPU call
    assert status.startswith("its sizes u0, u1, u2 depend on tensor values")


def test_assertions_plans_cannot_check_are_refused(tmp_path):
    class Even(torch.nn.Module):
        def forward(self, x, keep):
            rows = x[keep]
            torch._check(rows.shape[0] % 2 == 0)
            return rows * 2
    x, keep = torch.randn(3, 4), torch.tensor([True, True, False])
    with pytest.raises(ExportError, match="asserts a fact about a size") as info:
        aotc.export(Even(), (x, keep), tmp_path / "e.aotc")
    assert "Mod(u0, 2)" in info.value.found
    assert not (tmp_path / "e.aotc").exists()


def test_a_tensor_value_read_as_a_float_is_refused_by_name(tmp_path):
    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * x.max().item()
    with pytest.raises(ExportError, match="reads a tensor's value as a Python float") as info:
        aotc.export(Scale(), (torch.randn(3, 4),), tmp_path / "f.aotc")
    assert "x.max().item()" in info.value.where


# ---------------------------------------------------------------------- hostile plans
def _edited(adapters, tmp_path, edit_plan=None, edit_manifest=None):
    art = tmp_path / "h.aotc"
    shutil.copytree(adapters[1], art)
    if edit_plan is not None:
        rel = fmt.plan_file("forward")
        doc = json.loads((art / rel).read_bytes())
        edit_plan(doc)
        replace_file(art, rel, fmt.dumps(doc))
    if edit_manifest is not None:
        from conftest import read_raw_manifest, write_manifest
        manifest = read_raw_manifest(art)
        edit_manifest(manifest)
        write_manifest(art, manifest)
    rederive(art)   # the runner file the edited plan derives (tests/hostile.py)
    return art


def _binding(doc) -> dict:
    return next(s for s in doc["steps"] if "binds" in s)


@pytest.mark.parametrize("edit,problem", [
    (lambda d: _binding(d)["binds"].update(u0=[0, 1]), "binds u0 from slot"),
    (lambda d: _binding(d)["binds"].update(u0=[3, 0]), "binds u0 from result 3"),
    (lambda d: _binding(d)["binds"].update(zz=[0, 0]), "binds 'zz'"),
    (lambda d: _binding(d).pop("binds"), "unbound here"),
    (lambda d: [s.update(binds={"u0": [0, 0]}) for s in d["steps"] if "binds" in s
                and "u1" in s["binds"]], "binds u0 again"),
])
def test_hostile_binds_are_refused_at_load(adapters, tmp_path, edit, problem):
    art = _edited(adapters, tmp_path, edit_plan=edit)
    with pytest.raises(ArtifactError) as info:
        aotc.load(art)
    assert problem in str(info.value)


@pytest.mark.parametrize("runner", ["cpp", "python"])
def test_a_narrowed_range_is_checked_per_call(adapters, tmp_path, runner):
    def narrow(manifest):
        manifest["entries"]["forward"]["symbols"]["u1"].update(max=2, example=2)
    art = _edited(adapters, tmp_path, edit_manifest=narrow)
    m = aotc.load(art, runner=runner)
    x = torch.randn(2, 8, 16)
    m(x, torch.zeros(2, 8, dtype=torch.long))     # no rows of language 1: within [0, 2]
    with pytest.raises(GuardError) as info:
        m(x, torch.ones(2, 8, dtype=torch.long))
    assert "u1=16" in str(info.value) and info.value.expected == "0 <= u1 <= 2"


# ---------------------------------------------------------------------- C++ front end
pytestmark_cpp = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


@pytestmark_cpp
def test_cpp_front_end_runs_value_dependent_sizes(aotc_run, adapters, tmp_path):
    model, path = adapters
    m = aotc.load(path)
    for kind in ("mixed", "none"):
        x = (torch.randn(2, 8, 16), _languages(kind))
        done, outs = run_cpp(aotc_run, path, x, tmp_path)
        assert done.returncode == 0, done.stderr
        assert torch.equal(outs[0], m(*x))


@pytestmark_cpp
def test_cpp_front_end_checks_bound_ranges(aotc_run, adapters, tmp_path):
    rel = fmt.runner_file("forward")

    def narrow(doc):
        step = next(s for s in doc["steps"] if s[0] == "call" and len(s) == 10)
        step[9][0][4] = 2
    art = tmp_path / "r.aotc"
    shutil.copytree(adapters[1], art)
    doc = json.loads((art / rel).read_bytes())
    narrow(doc)
    replace_file(art, rel, fmt.dumps(doc))
    x = (torch.randn(2, 8, 16), torch.zeros(2, 8, dtype=torch.long))
    done, _ = run_cpp(aotc_run, art, x, tmp_path)
    assert done.returncode == GuardError.exit_code, done.stderr
    assert "u0=16, outside the range" in done.stderr and "0 <= u0 <= 2" in done.stderr


class Indexer(torch.nn.Module):
    """A sparse-attention indexer's shape (GLM-5's): a score per row kept, which rows the
    values decide, padded back to a fixed width under no_grad, beside a reshape over no
    elements."""

    def forward(self, x, keep):
        rows = x[keep]                                   # u0 rows of 8, u0 <= 4
        with torch.no_grad():
            scores = torch.nn.functional.pad(rows.sum(1), (0, 4 - rows.shape[0]), value=-1.0)
            empty = x[:, :0].reshape(2, 2, 0).sum(-1)
        return scores * 2 + empty.sum()


@pytest.mark.parametrize("kept", [[True, False, True, True], [False] * 4, [True] * 4])
def test_padding_by_a_value_dependent_amount_inside_no_grad(tmp_path, kept):
    x = torch.randn(4, 8)
    m = aotc.load(aotc.export(Indexer(), (x, torch.tensor([True, False, True, True])),
                              tmp_path / "i.aotc"))
    keep = torch.tensor(kept)
    torch.testing.assert_close(m(x, keep), Indexer()(x, keep))


def test_facts_implied_by_cases_of_a_min_or_max_are_dropped():
    import sympy
    from torch.utils._sympy.value_ranges import ValueRanges

    from aotc.exporter.bindings import implied
    u0, u1 = sympy.Symbol("u0", integer=True), sympy.Symbol("u1", integer=True)
    ranges = {u0: ValueRanges(0, 1 << 40), u1: ValueRanges(0, 10)}
    proved = [sympy.Le(sympy.Min(128, u0), u0), sympy.Ge(sympy.Max(128, u0), u0),
              sympy.Le(sympy.Max(u1, 4), 10), sympy.Ge(u0, 0)]
    unproved = [sympy.Le(u0, sympy.Min(128, u0)), sympy.Eq(u0 + u1, 128),
                sympy.Le(sympy.Max(u1, 11), 10)]
    assert all(implied(f, ranges) for f in proved)
    assert not any(implied(f, ranges) for f in unproved)
