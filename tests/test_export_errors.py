"""Export failures are ExportErrors that name the user's file and line."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import aotc
from aotc.api import export_file
from aotc.errors import ExportError, UsageError
from aotc.exporter.specs import parse_input_spec
from conftest import MODELS_DIR, import_file


def _line_of(path: Path, marker: str) -> tuple[int, str]:
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if marker in line:
            return n, line.split("#")[0].strip()
    raise AssertionError(f"{marker} not in {path}")


@pytest.fixture
def user_model(tmp_path):
    """Copy a model file from tests/models/ to a folder outside the aotc tree, like a user's."""
    def make(name: str) -> Path:
        dest = tmp_path / "user_code" / name
        dest.parent.mkdir(exist_ok=True)
        shutil.copy(MODELS_DIR / name, dest)
        return dest
    return make


def _assert_where(err: ExportError, path: Path, marker: str):
    line, code = _line_of(path, marker)
    assert err.where is not None
    parts = err.where.split(":", 2)
    assert len(parts) == 3, f"`where` does not name file:line: {err.where!r}"
    file, lineno, rest = parts
    assert Path(file).resolve() == path.resolve(), err.where
    assert int(lineno) == line, err.where
    assert code in rest, err.where
    assert f"{path.name}:{line}" in str(err)


def test_data_dependent_control_flow(user_model):
    path = user_model("data_dependent.py")
    model = import_file(path).Net()
    with pytest.raises(ExportError) as info:
        aotc.export(model, (torch.randn(2, 4),), path.parent / "out.aotc")
    _assert_where(info.value, path, "DATA-DEPENDENT")
    assert "torch.where" in info.value.fix or "torch.cond" in info.value.fix
    assert info.value.exit_code == 3
    assert not (path.parent / "out.aotc").exists()


def test_data_dependent_control_flow_from_file_ref(user_model, tmp_path):
    path = user_model("data_dependent.py")
    with pytest.raises(ExportError) as info:
        export_file(f"{path}:Net", [parse_input_spec("2x4")], tmp_path / "out.aotc")
    _assert_where(info.value, path, "DATA-DEPENDENT")


@pytest.mark.parametrize("name,marker", [("data_dependent.py", "DATA-DEPENDENT"),
                                         ("eager_failure.py", "EAGER-FAILURE")])
def test_error_located_in_model_file_inside_aotc_tree(name, marker, tmp_path):
    path = MODELS_DIR / name     # tests/models/ lies inside the aotc package root
    model = import_file(path).Net()
    with pytest.raises(ExportError) as info:
        aotc.export(model, (torch.randn(2, 4),), tmp_path / "out.aotc")
    _assert_where(info.value, path, marker)


def test_forward_fails_eagerly(user_model):
    path = user_model("eager_failure.py")
    model = import_file(path).Net()
    with pytest.raises(ExportError) as info:
        aotc.export(model, (torch.randn(2, 4),), path.parent / "out.aotc")
    _assert_where(info.value, path, "EAGER-FAILURE")
    assert "failed on the example inputs" in str(info.value)
    assert info.value.found == "RuntimeError"
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not (path.parent / "out.aotc").exists()


def test_returns_non_tensor_object(user_model):
    path = user_model("returns_object.py")
    model = import_file(path).Net()
    with pytest.raises(ExportError) as info:
        aotc.export(model, (torch.randn(2, 4),), path.parent / "out.aotc")
    assert "Result" in str(info.value) and info.value.found == "Result"
    assert not (path.parent / "out.aotc").exists()


@pytest.mark.parametrize("value", [lambda x: {x.sum().item()}, lambda x: (x, object())])
def test_returns_other_non_tensors(value, tmp_path):
    class Net(torch.nn.Module):
        def forward(self, x):
            return value(x)

    with pytest.raises(ExportError, match="cannot put in an artifact"):
        aotc.export(Net(), (torch.randn(2, 4),), tmp_path / "out.aotc")


def test_import_error_in_model_file(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import torch\n\nraise RuntimeError('boom at import')\n")
    with pytest.raises(ExportError) as info:
        export_file(f"{path}:Net", [parse_input_spec("2x4")], tmp_path / "out.aotc")
    assert "boom at import" in str(info.value)
    assert f"{path}:3" in info.value.where


def test_example_inputs_must_be_tensors(tmp_path):
    with pytest.raises(UsageError, match="example input #1"):
        aotc.export(torch.nn.Linear(4, 4), (torch.randn(2, 4), 3), tmp_path / "out.aotc")


def test_unknown_export_option(tmp_path):
    with pytest.raises(UsageError, match="unknown export option 'stict'"):
        aotc.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),), tmp_path / "out.aotc",
                    stict=False)


def test_bad_target_refused_before_capture(tmp_path, monkeypatch):
    import aotc.exporter
    monkeypatch.setattr(aotc.exporter, "export", lambda *a, **k: pytest.fail("captured"))
    with pytest.raises(UsageError, match="unknown target"):
        aotc.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),), tmp_path / "out.aotc",
                    target="tpu")
    assert not (tmp_path / "out.aotc").exists()


def test_data_dependent_failure_in_a_library_names_its_line_and_the_callers(tmp_path):
    # torchvision's detection post-processing (batched_nms) fails capture inside the
    # library: the error names that line, then the model's line that called it, and a fix
    lib = tmp_path / "site-packages"
    lib.mkdir()
    (lib / "detlib.py").write_text(
        "def keep_positive(boxes):\n"
        "    kept = boxes[boxes[:, 0] > 0]\n"
        "    if kept.shape[0] > 2:\n"
        "        return kept * 2\n"
        "    return kept\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("detlib", lib / "detlib.py")
    detlib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(detlib)

    class Det(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return detlib.keep_positive(self.fc(x))

    with pytest.raises(aotc.ExportError) as info:
        aotc.export(Det().eval(), (torch.randn(8, 4),), tmp_path / "d.aotc")
    err = info.value
    assert "data-dependent" in err.what
    assert err.where.startswith(f"{lib / 'detlib.py'}:3: if kept.shape[0] > 2:")
    assert "called from" in err.where and "test_export_errors.py" in err.where
    assert "export the part of the model before it" in err.fix


class _GradIntermediate(torch.nn.Module):
    def forward(self, x):
        y = (x * 2).requires_grad_()   # Dynamo: "returning intermediate with requires_grad_()"
        return torch.relu(y + 1)


@pytest.mark.parametrize("strict", [True, False])
def test_what_dynamo_cannot_follow_is_traced_with_python(tmp_path, strict):
    """A construct Dynamo does not support falls back to torch.export's non-strict tracing,
    and the manifest's options say so and why (MRA, YOSO and CTRL in the zoo)."""
    model, x = _GradIntermediate(), torch.randn(3, 5)
    path = aotc.export(model, (x,), tmp_path / "m.aotc", strict=strict)
    torch.testing.assert_close(aotc.load(path)(x), model(x))
    note = aotc.load(path).manifest.options.get("capture")
    if strict:
        assert note.startswith("traced with Python (non-strict)") and "requires_grad_" in note
    else:
        assert note is None


class _NumpyLayerDrop(torch.nn.Module):
    """VITS's and MusicGen's layer drop: a NumPy random number drawn in forward, compared in a
    branch that only training takes (Dynamo traces the NumPy call into a data-dependent float
    and cannot guard on it; a Python trace draws a plain number)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 5)

    def forward(self, x):
        import numpy as np
        drop = np.random.uniform(0, 1)
        if self.training and drop < 0.1:
            return x
        return self.lin(x)


def test_values_dynamo_makes_data_dependent_from_python_code_are_traced_with_python(tmp_path):
    model, x = _NumpyLayerDrop().eval(), torch.randn(3, 5)
    path = aotc.export(model, (x,), tmp_path / "m.aotc")
    torch.testing.assert_close(aotc.load(path)(x), model(x))
    note = aotc.load(path).manifest.options.get("capture")
    assert note.startswith("traced with Python (non-strict)") and "data-dependent" in note


class _MaskedRows(torch.nn.Module):
    def forward(self, x, keep):
        return x[keep].sum(0)   # rows chosen by a boolean mask: a size only the values give


def test_a_size_that_depends_on_values_exports_for_inference_and_not_for_training(tmp_path):
    x, keep = torch.randn(4, 3), torch.tensor([True, False, True, True])
    m = aotc.load(aotc.export(_MaskedRows(), (x, keep), tmp_path / "m.aotc"))
    for mask in (keep, torch.zeros(4, dtype=torch.bool), torch.ones(4, dtype=torch.bool)):
        torch.testing.assert_close(m(x, mask), _MaskedRows()(x, mask))
    with pytest.raises(ExportError) as info:
        aotc.export(_MaskedRows(), (x, keep), tmp_path / "t.aotc", train=True)
    assert "inference only" in info.value.fix
    assert not (tmp_path / "t.aotc").exists()


class _ExpertLoop(torch.nn.Module):
    """Switch-Transformer routing: a loop over the experts that received tokens."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, route):
        out = torch.zeros_like(x)
        for e in torch.bincount(route, minlength=3).nonzero():   # EXPERT-LOOP
            out = out + self.experts[int(e)](x)
        return out


def test_loop_over_nonzero_gets_the_data_dependent_fix(tmp_path):
    # "Could not extract specialized integer from data-dependent expression": a size that
    # depends on values, not a dynamic dim the code narrows
    with pytest.raises(ExportError) as info:
        aotc.export(_ExpertLoop(), (torch.randn(5, 4), torch.tensor([0, 2, 2, 0, 1])),
                    tmp_path / "m.aotc")
    assert "depends on tensor values" in info.value.fix, info.value
    assert "EXPERT-LOOP" in info.value.where
    assert not (tmp_path / "m.aotc").exists()


def test_a_nodes_source_names_the_library_line_and_the_models_own(tmp_path):
    """Errors about a graph node name the innermost line outside torch (a library's modeling
    file) and then the model's own line that called it."""
    from aotc.exporter.program import node_source
    lib = tmp_path / "site-packages" / "lib" / "modeling.py"
    lib.parent.mkdir(parents=True)
    lib.write_text("def f():\n    return sizes.tolist()\n")
    own = tmp_path / "model.py"
    own.write_text("x = 1\ny = f()\n")
    torch_frame = "/x/site-packages/torch/nn/functional.py"
    trace = (f'  File "{own}", line 2, in forward\n    y = f()\n'
             f'  File "{lib}", line 2, in f\n    return sizes.tolist()\n'
             f'  File "{torch_frame}", line 9, in pad\n    return 0\n')
    assert node_source(trace) == ("modeling.py:2: return sizes.tolist() (called from "
                                  "model.py:2: y = f())")
    only_own = f'  File "{own}", line 2, in forward\n    y = f()\n'
    assert node_source(only_own) == "model.py:2: y = f()"
    assert node_source(None) is None
