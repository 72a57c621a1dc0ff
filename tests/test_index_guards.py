"""Index inputs are guarded as eager PyTorch guards them: negative and too-large ids of an
embedding, gather or index_select are refused with a GuardError naming the input, the valid
range and the first offending value; negative indices of advanced indexing (aten.index) wrap,
as in eager. On the CPU and through the Triton kernels of a CUDA artifact alike, and in plans
without generated kernels (--no-codegen), where ATen's own check is named the same way."""
from __future__ import annotations

import pytest
import torch

import aotc
from aotc.api import compile_function

TRITON = {"target": "cuda:sm_90"}


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)

    def forward(self, input_ids):
        return self.emb(input_ids) * 2


def _load(path, triton: bool):
    return aotc.load(path, device="cpu", interpret=True) if triton else aotc.load(path)


@pytest.mark.parametrize("triton", [False, True, "aten"], ids=["cpu", "triton", "no-codegen"])
@pytest.mark.parametrize("bad,pos", [(-1, [0, 2]), (50, [1, 0]), (10**6, [1, 3])])
def test_embedding_ids_out_of_range_name_the_input_and_value(tmp_path, triton, bad, pos):
    if triton is True:
        pytest.importorskip("triton")
    model = Embed().eval()
    ids = torch.randint(0, 50, (2, 4))
    options = TRITON if triton is True else {"codegen": False} if triton == "aten" else {}
    path = aotc.export(model, (ids,), tmp_path / "e.aotc", **options)
    m = _load(path, triton is True)
    torch.testing.assert_close(m(ids), model(ids))
    wrong = ids.clone()
    wrong[tuple(pos)] = bad
    with pytest.raises(aotc.GuardError) as e:
        m(wrong)
    err = e.value
    assert err.where == "input 'input_ids' (#0)"
    assert f"holds index {bad} at position {pos}" in err.what
    assert "[0, 49]" in err.expected and "embedding" in err.expected
    with pytest.raises(IndexError):   # eager refuses it too
        model(wrong)
    torch.testing.assert_close(m(ids), model(ids))    # the module still works


@pytest.mark.parametrize("triton", [False, True], ids=["cpu", "triton"])
def test_advanced_indexing_wraps_negative_indices_as_eager_does(tmp_path, triton):
    if triton:
        pytest.importorskip("triton")
    x, idx = torch.randn(10, 4), torch.tensor([0, 3, 9])
    fn = lambda a, i: a[i] * 3   # noqa: E731
    path = compile_function(fn, (x, idx), tmp_path / "i.aotc", **(TRITON if triton else {}))
    m = _load(path, triton)
    for i in (torch.tensor([-1, -10, 2]), torch.tensor([9, 0, -3])):
        torch.testing.assert_close(m(x, i), fn(x, i))
    with pytest.raises(aotc.GuardError, match=r"outside \[-10, 9\]"):
        m(x, torch.tensor([0, -11, 1]))


@pytest.mark.parametrize("codegen", [True, False])
@pytest.mark.parametrize("which", ["gather", "index_select"])
def test_gather_and_index_select_refuse_negative_indices(tmp_path, which, codegen):
    x = torch.randn(6, 5)
    if which == "gather":
        fn, i = (lambda a, i: torch.gather(a, 1, i) + 1), torch.randint(0, 5, (6, 2))
    else:
        fn, i = (lambda a, i: torch.index_select(a, 0, i) + 1), torch.tensor([0, 5, 2])
    m = aotc.load(compile_function(fn, (x, i), tmp_path / "g.aotc", codegen=codegen))
    torch.testing.assert_close(m(x, i), fn(x, i))
    bad = i.clone()
    bad.view(-1)[1] = -1
    with pytest.raises((IndexError, RuntimeError)):
        fn(x, bad)
    with pytest.raises(aotc.GuardError, match="holds index -1"):
        m(x, bad)


@pytest.mark.parametrize("make", [lambda t: t.to_sparse(), lambda t: t.to_sparse_csr(),
                                  lambda t: torch.empty_like(t, device="meta")],
                         ids=["coo", "csr", "meta"])
def test_sparse_and_storage_less_inputs_are_guard_errors(mlp_artifact, make):
    m = aotc.load(mlp_artifact)
    with pytest.raises(aotc.GuardError, match="input 'x'"):
        m(make(torch.randn(32, 64)))


def test_gpt2_token_ids_are_checked(exported):
    ex = exported("gpt2")
    m = aotc.load(ex.path)
    ids = ex.inputs[0].clone()
    ids[1, 5] = -7
    with pytest.raises(aotc.GuardError, match=r"holds index -7 at position \[1, 5\]") as e:
        m(ids)
    assert "input_ids" in e.value.where and "[0, 999]" in e.value.expected
