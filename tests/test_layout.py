"""Channels-last convolutions on the CPU: a 2d convolution with a model weight runs with the
weight converted channels-last at load, its output stays channels-last, and the kernels that
read it loop (n, h, w, c) and store channels-last, so the next convolution gets the layout it
is fastest in. Graph outputs keep eager's layout; weights with other readers are left alone."""
import json

import pytest
import torch
from torch import nn

import aotc


class ConvNet(nn.Module):
    def __init__(self, head: str = "pool"):
        super().__init__()
        self.head = head
        self.c1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4 if head == "flatten" else 8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.c1(x)))
        x = nn.functional.max_pool2d(x, 2) + nn.functional.avg_pool2d(x, 2)
        x = torch.relu(self.c2(x))
        if self.head == "flatten":   # a view of channels-last data read by an extern (addmm)
            return self.fc(torch.flatten(x, 1))
        return self.fc(x.mean((2, 3)))


def _export(model, x, path):
    model.eval()
    with torch.no_grad():
        for p in model.parameters():   # non-trivial batch norm statistics
            p.add_(torch.randn_like(p) * 0.1)
        if hasattr(model, "bn"):
            model.bn.running_mean.uniform_(-0.5, 0.5)
            model.bn.running_var.uniform_(0.5, 1.5)
    p = aotc.export(model, (x,), path)
    return aotc.load(p), json.loads((p / "plans/forward.json").read_text())


def _conv_outputs(plan):
    convs = [s for s in plan["steps"] if s.get("op") == "aten::convolution.default"]
    return [plan["slots"][s["out"][0]] for s in convs]


@pytest.mark.parametrize("head", ["pool", "flatten"])
def test_convolutions_run_channels_last_and_match_eager(head, tmp_path):
    torch.manual_seed(0)
    model, x = ConvNet(head), torch.randn(4, 3, 8, 8)
    m, plan = _export(model, x, tmp_path / "net.aotc")
    outs = _conv_outputs(plan)
    assert len(outs) == 2
    for s in outs:   # (n, c, h, w) with strides (h*w*c, 1, w*c, c)
        n, c, h, w = s["shape"]
        assert s["stride"] == [h * w * c, 1, w * c, c]
    weights = [s for s in plan["slots"] if s.get("memory_format") == "channels_last"]
    assert len(weights) == 2
    assert "empty_strided(" in m.code   # a kernel stores channels-last (the pooled activations)
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-4)
        x2 = torch.randn(4, 3, 8, 8)
        torch.testing.assert_close(m(x2), model(x2), rtol=1e-4, atol=1e-4)


def test_kernels_reading_channels_last_loop_over_channels_innermost(tmp_path):
    torch.manual_seed(0)
    m, plan = _export(ConvNet(), torch.randn(2, 3, 8, 8), tmp_path / "net.aotc")
    src = (tmp_path / "net.aotc/kernels/kernels.cpp").read_text()
    # the first kernel (batch norm + relu + both pools) vectorizes along the 16 channels
    first = src[src.index("int kernel0("):src.index("int kernel1(")]
    assert "for (int64_t x0 = 0; x0 < 16; ++x0)" in first
    assert "#pragma omp simd" in first


class ConvOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.c(x), torch.relu(self.c(x)) * 2


class SharedWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3)

    def forward(self, x):   # the weight has a second reader: it keeps its layout
        return torch.relu(self.c(x)) + self.c.weight.mean()


def test_graph_outputs_keep_eager_layout(tmp_path):
    torch.manual_seed(0)
    model, x = ConvOut(), torch.randn(2, 3, 9, 9)
    m, plan = _export(model, x, tmp_path / "out.aotc")
    with torch.no_grad():
        got, want = m(x), model(x)
    torch.testing.assert_close(got, want)
    assert got[0].is_contiguous()


def test_weight_with_other_readers_keeps_its_layout(tmp_path):
    torch.manual_seed(0)
    model, x = SharedWeight(), torch.randn(2, 3, 9, 9)
    m, plan = _export(model, x, tmp_path / "shared.aotc")
    assert not [s for s in plan["slots"] if s.get("memory_format") == "channels_last"]
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x))


def test_a_convolution_answering_in_another_layout_is_copied_not_misread(tmp_path):
    """The plan states the layout it expects; a torch whose convolution returns another one
    (e.g. one without oneDNN) costs a copy, never a wrong read."""
    torch.manual_seed(0)
    model, x = ConvNet(), torch.randn(2, 3, 8, 8)
    m, _ = _export(model, x, tmp_path / "net.aotc")
    m = aotc.load(m.path, runner="python")   # an op substituted in the Python runner's namespace
    real = torch.ops.aten.convolution.default
    ns = m.entries["forward"].function.namespace
    ns["aten_convolution_default"] = lambda *a: real(*a).contiguous()
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-4)


class PermutedKernelOutput(nn.Module):
    """exp of a permuted input: eager's result keeps the permuted strides, so the unsqueeze,
    permute and view after it make a contiguous tensor there; aotc's kernel stores that result
    contiguously, where the same chain cannot `view` (mamba2 and SEW-D hit this)."""

    def forward(self, x):
        y = torch.exp(x.permute(0, 2, 3, 1))
        z = y.unsqueeze(4).permute(0, 3, 1, 2, 4).view(8, 8, 8)
        return z @ z


@pytest.mark.parametrize("codegen", [True, False])
def test_views_of_a_kernel_output_stored_otherwise_than_eager(tmp_path, codegen):
    model, x = PermutedKernelOutput(), torch.randn(2, 4, 8, 8)
    path = aotc.export(model, (x,), tmp_path / "m.aotc", codegen=codegen)
    torch.testing.assert_close(aotc.load(path)(x), model(x))


class ConvNeXtBlocks(nn.Module):
    """torchvision's ConvNeXt stem and two CNBlocks: depthwise 7x7 convolution, the channels
    MLP over [N, H, W, C], permuted back to [N, C, H, W], layer scale, residual add."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 2, 2)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "dw": nn.Conv2d(dim, dim, 7, padding=3, groups=dim), "norm": nn.LayerNorm(dim),
            "up": nn.Linear(dim, 4 * dim), "down": nn.Linear(4 * dim, dim)}) for _ in range(2))
        self.scale = nn.Parameter(torch.full((dim, 1, 1), 0.5))

    def forward(self, x):
        x = self.stem(x).permute(0, 2, 3, 1)
        x = nn.functional.layer_norm(x, x.shape[-1:]).permute(0, 3, 1, 2)   # LayerNorm2d
        for b in self.blocks:
            y = b["norm"](b["dw"](x).permute(0, 2, 3, 1))
            x = x + self.scale * b["down"](nn.functional.gelu(b["up"](y))).permute(0, 3, 1, 2)
        return x.mean((2, 3))


def test_convnext_blocks_stay_channels_last_between_convolutions(tmp_path):
    """[N, H, W, C] data permuted to [N, C, H, W] is channels-last data: the residual add is
    stored channels-last, so every depthwise convolution reads channels-last input (it read
    an NCHW tensor the add had stored transposed, and converted it)."""
    torch.manual_seed(0)
    model, x = ConvNeXtBlocks(), torch.randn(2, 3, 16, 16)
    m, plan = _export(model, x, tmp_path / "cnx.aotc")
    convs = [s for s in plan["steps"] if s.get("op") == "aten::convolution.default"]
    assert len(convs) == 3
    for step in convs:
        n, c, h, w = plan["slots"][step["args"][0]["slot"]]["shape"]
        layout = plan["slots"][step["args"][0]["slot"]]["stride"]
        assert step is convs[0] or layout == [h * w * c, 1, w * c, c], layout
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-4)
