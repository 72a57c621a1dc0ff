"""Extern and view steps get the layouts they need (codegen/extern_layout.py): ATen ops
propagate a channels-last input's layout, so a `view` after an extern pool over a
channels-last convolution's output (torchvision's VGG: adaptive pool, flatten, classifier)
must not assume the eager, contiguous layout; an ATen kernel handed a layout that is neither
contiguous nor channels-last gets a contiguous copy. Models run with contiguous and
channels-last inputs, exported from either."""
import json

import pytest
import torch
from torch import nn

import aotc


class PoolFlatten(nn.Module):
    """conv-bn-relu, max pool, then ATen's adaptive average pool (an extern, which answers
    channels-last) and a flatten (a view) before the classifier, as in VGG."""

    def __init__(self, transpose: bool = False):
        super().__init__()
        self.transpose = transpose
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        if self.transpose:   # neither contiguous nor channels-last when it reaches the pool
            x = x.transpose(2, 3)
        x = nn.functional.adaptive_avg_pool2d(x, (4, 4))   # 6 -> 4: not a plain window
        return self.fc(torch.flatten(x, 1))


def _layouts(x):
    return {"contiguous": x.contiguous(), "channels_last":
            x.contiguous(memory_format=torch.channels_last)}


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("exported_as", ["contiguous", "channels_last"])
def test_extern_pool_and_flatten_over_channels_last(transpose, exported_as, tmp_path):
    torch.manual_seed(0)
    model = PoolFlatten(transpose).eval()
    x = torch.randn(2, 3, 12, 12)
    path = aotc.export(model, (_layouts(x)[exported_as],), tmp_path / "m.aotc")
    m = aotc.load(path)
    for layout, inp in _layouts(torch.randn(2, 3, 12, 12)).items():
        with torch.no_grad():
            want = model(inp)
        torch.testing.assert_close(m(inp), want, rtol=1e-4, atol=1e-4, msg=layout)
    plan = json.loads((path / "plans/forward.json").read_text())
    pool = next(s for s in plan["steps"] if "adaptive_avg_pool2d" in s.get("op", ""))
    out = plan["slots"][pool["out"][0]]
    # the pool's slot records what ATen returns for its planned input
    assert out["contiguous"] is transpose


class TiedHead(nn.Module):
    """A language-model head tied to the embedding: `x @ E.t()` hands `mm` a transposed
    weight, laid out as eager laid it out, which ATen takes as it is."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)

    def forward(self, ids):
        h = torch.tanh(self.emb(ids))
        return h @ self.emb.weight.t()


def test_transposed_weight_is_not_copied(tmp_path):
    torch.manual_seed(0)
    model = TiedHead().eval()
    ids = torch.randint(0, 50, (2, 5))
    path = aotc.export(model, (ids,), tmp_path / "m.aotc")
    torch.testing.assert_close(aotc.load(path)(ids), model(ids), rtol=1e-5, atol=1e-5)
    plan = (path / "plans/forward.json").read_text()
    assert "layout_copy" not in plan
    assert "aten::clone" not in plan
