"""One-row products over one input made one product (codegen/product_groups.py): a grouped-
query layer's q, k and v projections at batch 1 are one reduction over all three weights, and
generate the tokens they generated apart."""
from __future__ import annotations

import json

import pytest
import torch

import aotc
from aotc.codegen.product_groups import group_products
from conftest import llama_sample

pytest.importorskip("triton")
CACHE = 32


def _model():
    return llama_sample(vocab=300)


def _weights_read(path, entry: str) -> list[set]:
    """The weights each kernel of an entry's plan reads."""
    plan = json.loads((path / "plans" / f"{entry}.json").read_text())
    weights = {i: s.get("weight") for i, s in enumerate(plan["slots"]) if s.get("weight")}
    out = []
    for s in plan["steps"]:
        if s["kind"] == "kernel":
            out.append({weights[a] for a in s["args"] if isinstance(a, int) and a in weights})
    return out


def _qkv_decoder(tmp_path):
    ids = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(1))
    return ids, aotc.export(_model(), (ids,), tmp_path / "g.aotc", decode=True,
                            max_cache_len=CACHE, target="cuda:sm_90")


def test_q_k_v_at_batch_1_are_one_kernel(tmp_path):
    _, path = _qkv_decoder(tmp_path)
    reads = _weights_read(path, "decode")
    qkv = [r for r in reads if any(w.endswith("wq.weight") for w in r)]
    assert len(qkv) == 2                                  # one kernel per layer
    assert all({w.rsplit(".", 2)[-2] for w in r} >= {"wq", "wk", "wv"} for r in qkv)


@pytest.mark.slow
def test_q_k_v_as_one_kernel_generate_the_same(tmp_path):
    ids, path = _qkv_decoder(tmp_path)
    from aotc.exporter.generate import Generator, adapt, eager_generate
    want = eager_generate(Generator(adapt(_model(), 1, CACHE), CACHE), ids, 6)
    got = aotc.load(path, device="cpu", interpret=True).generate(ids, 6)
    assert torch.equal(got, want)


def _graph(rows: int, widths=(8, 4, 4), k: int = 16, biased=()):
    """mm(view(x), permute(W_i)) for each width, as a captured Linear reads; addmm(b_i, ...)
    for the products numbered in `biased`."""
    values = [{"shape": [rows, k], "dtype": "float32", "stride": [k, 1]}]
    inputs = [{"kind": "input", "name": "x", "value": 0}]
    nodes, outputs = [], []
    for i, n in enumerate(widths):
        w, t, out = len(values), len(values) + 1, len(values) + 2
        values += [{"shape": [n, k], "dtype": "float32", "stride": [k, 1]},
                   {"shape": [k, n], "dtype": "float32", "stride": [1, k]},
                   {"shape": [rows, n], "dtype": "float32", "stride": [n, 1]}]
        inputs.append({"kind": "weight", "name": f"w{i}", "value": w})
        args = [{"slot": 0}, {"slot": t}]
        if i in biased:
            values.append({"shape": [n], "dtype": "float32", "stride": [1]})
            inputs.append({"kind": "weight", "name": f"b{i}", "value": len(values) - 1})
            args = [{"slot": len(values) - 1}, *args]
        nodes += [{"op": "aten::permute.default", "args": [{"slot": w}, [1, 0]], "kwargs": {},
                   "out": [t], "single": True},
                  {"op": "aten::addmm.default" if i in biased else "aten::mm.default",
                   "args": args, "kwargs": {}, "out": [out], "single": True}]
        outputs.append({"slot": out})
    return {"values": values, "inputs": inputs, "nodes": nodes, "outputs": outputs}


def test_one_row_products_with_biases_are_grouped_with_their_biases():
    """Qwen2's q/k/v: addmm(b_i, x, W_i) -> addmm(cat(b), x, cat(W)); a group never mixes
    products with and without a bias."""
    grouped = group_products(_graph(1, biased=(0, 1, 2)))
    ops = [n["op"] for n in grouped["nodes"]]
    assert ops.count("aten::addmm.default") == 1 and ops.count("aten::cat.default") == 2
    addmm = next(n for n in grouped["nodes"] if n["op"] == "aten::addmm.default")
    cat_b = next(n for n in grouped["nodes"] if n["out"] == [addmm["args"][0]["slot"]])
    assert [a["slot"] for a in cat_b["args"][0]] == [4, 8, 12] and cat_b["args"][1] == 0
    assert grouped["values"][addmm["args"][0]["slot"]]["shape"] == [16]
    mixed = [n["op"] for n in group_products(_graph(1, biased=(1,)))["nodes"]]
    assert mixed.count("aten::mm.default") == 1 and mixed.count("aten::addmm.default") == 1
    assert mixed.count("aten::cat.default") == 1       # the two mm's weights only


def test_only_one_row_products_of_different_widths_are_grouped():
    graph = _graph(1)
    grouped = group_products(graph)
    ops = [n["op"] for n in grouped["nodes"]]
    assert ops.count("aten::mm.default") == 1 and ops.count("aten::slice.Tensor") == 3
    assert [n["op"] for n in graph["nodes"]].count("aten::mm.default") == 3   # left as it was
    slices = [n for n in grouped["nodes"] if n["op"] == "aten::slice.Tensor"]
    assert [n["args"][2:4] for n in slices] == [[0, 8], [8, 12], [12, 16]]
    assert [n["out"] for n in slices] == [[o["slot"]] for o in graph["outputs"]]
    assert grouped["values"][slices[0]["out"][0]]["stride"] == [16, 1]
    for other in (_graph(2), _graph(1, widths=(8, 8))):   # GEMMs; one width: fused already
        assert group_products(other) is other


def test_the_grouped_products_bf16_values_are_stored_by_its_own_kernel(tmp_path):
    """In bf16 the attention kernel reads the values of the grouped product as a bf16 buffer:
    that cast is the product kernel's epilogue, though view steps (the product's slices into
    q, k and v) come between them in the plan (codegen/scheduler.py), not a kernel of its
    own; the decode step's logits stay those of eager bf16."""
    model = _model().to(torch.bfloat16)
    ids = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(1))
    path = aotc.export(model, (ids,), tmp_path / "g.aotc", decode=True, max_cache_len=CACHE,
                       target="cuda:sm_90")
    plan = json.loads((path / "plans" / "decode.json").read_text())
    kernels = [[f["ops"][-1] for f in s["fused"]] for s in plan["steps"]
               if s["kind"] == "kernel" and s.get("fused")]
    casts = [k for k in kernels if k[-1] == "mm" and "matvec" not in k]
    assert not casts, kernels
    m = aotc.load(path, device="cpu", interpret=True)
    m.prefill(ids)
    got = m.decode(ids[:, -1:])
    with torch.no_grad():
        want = model(torch.cat([ids, ids[:, -1:]], 1))[:, -1]
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)
