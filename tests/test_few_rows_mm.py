"""aten::mm of few rows on the CPU (runtime/cpp/few_rows.cpp): float32 products of 1 to 8 rows
over a weight stored [K, N] stream the weight once instead of MKL's packed product; they
equal eager's product (float64 reference), and each row's result does not depend on how many
rows the product has, so a slot's decode is bitwise the same in every decode bucket."""
import pytest
import torch
from torch import nn

import aotc
from aotc.runtime.cpp_runner import runner_status
from conftest import slot0_logits_by_bucket

RUNNER, WHY = runner_status()
pytestmark = pytest.mark.skipif(RUNNER is None, reason=f"no C++ runner here: {WHY}")


class Proj(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.fc = nn.Linear(k, n, bias=False)

    def forward(self, x):
        return self.fc(x) * 2.0


@pytest.mark.parametrize("rows", [1, 3, 8, 9])
def test_few_rows_equal_eager(tmp_path, rows):
    torch.manual_seed(rows)
    model = Proj(96, 300).eval()          # 300 columns: a whole tile of 256 and a tail of 44
    x = torch.randn(rows, 96)
    m = aotc.load(aotc.export(model, (x,), tmp_path / "p.aotc", target="cpu"))
    for _ in range(2):
        x = torch.randn(rows, 96)
        want = (x.double() @ model.fc.weight.double().t() * 2).float()
        torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)


def test_a_slot_decodes_bitwise_alike_in_every_bucket(slot_llm):
    """Slot 0's logits from the 2-slot bucket equal those of the 4-slot decode exactly."""
    one, four = slot0_logits_by_bucket(slot_llm)
    assert torch.equal(one, four)


@pytest.mark.parametrize("n", [1000, 4096, 40])
def test_kernel_blocks_and_tails_equal_float64_and_each_other(n):
    """The kernel alone, at widths that reach its wide blocks (8 vectors for one row, 4 for
    two), the 2-vector blocks left after them and the scalar tail: each row equals a float64
    product, and bitwise the same row of any other number of rows."""
    from aotc.runtime.executor import runner_mm
    mm = runner_mm()
    torch.manual_seed(n)
    w, x = torch.randn(200, n), torch.randn(8, 200)
    full = mm(x, w)
    torch.testing.assert_close(full, (x.double() @ w.double()).float(), rtol=1e-5, atol=1e-4)
    for rows in range(1, 8):
        for first in (0, 8 - rows):
            assert torch.equal(mm(x[first:first + rows], w), full[first:first + rows]), rows
