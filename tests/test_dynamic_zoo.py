"""Zoo models exported with a dynamic batch and sequence (`benchmarks.zoo --dynamic`) that
failed before aotc's own decompositions and layout check: ConvBERT (unfold's F.pad read the
batch as an int), SEW (F.pad), SEW-D (a view of a convolution's output that export laid out
otherwise than the kernel stores it: a `view` of a non-contiguous tensor at run time), BLOOM
(baddbmm's meta function expanding the alibi with int sizes: an untyped RuntimeError). Each
must export and match eager at the example sizes and at batch 3 with a shorter sequence and
batch 1."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["convbert", "sew", "sew_d", "bloom"])
def test_dynamic_batch_and_sequence(tmp_path, name):
    from benchmarks.zoo import zoo_spec
    from benchmarks.zoo_check import check
    rec = check(zoo_spec(name), "small", tmp_path, compile_baseline=False, dynamic=True)
    assert rec["status"] == "pass", rec.get("message")
    assert rec["dynamic"][0][0] == "batch"
