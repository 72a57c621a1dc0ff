"""Export's host memory: capture does not copy the model's parameters (exporter/capture.py).

Dynamo keeps a real-valued twin of each tensor it meets while exporting; for parameters that
twin is a second copy of the model. Measured in a fresh process, so the rest of the suite's
memory does not blur it: its peak resident memory (VmHWM, reset just before the capture), not
ru_maxrss, which counts the pytest process's pages at fork."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from aotc.exporter.capture import capture, parameters_shared

_CHILD = r"""
import json, torch
from aotc.exporter.capture import capture

def status(key):   # this process's own figures (ru_maxrss would count the parent's at fork)
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(key + ":"))

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4096, 4096)      # 64 MiB each in float32
        self.b = torch.nn.Linear(4096, 4096)
        self.c = torch.nn.Linear(4096, 4096)
        self.register_buffer("scale", torch.ones(4096))

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x))))) * self.scale

torch.manual_seed(0)
net = Net().eval()
x = torch.randn(2, 4096)
net(x)                                             # the forward's own working memory
small = torch.nn.Linear(4, 4)                      # Dynamo's and export's code, imported
capture(small, (torch.randn(1, 4),), strict=True, source=None)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")                                   # the peak starts again from here
before = status("VmRSS")
ep = capture(net, (x,), strict=True, source=None)
peak = status("VmHWM")
weights = sum(p.numel() * p.element_size() for p in net.parameters())
print(json.dumps({"before": before, "peak": peak, "weights": weights,
                  "nodes": len(ep.graph.nodes)}))
"""


def test_capture_does_not_copy_parameters():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         timeout=600, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    grown = got["peak"] - got["before"]
    # one copy of the parameters (192 MiB) is what Dynamo's twins cost, and clone_input's own
    # temporary makes the peak higher still; capturing itself needs a few tens of MiB
    assert grown < 0.25 * got["weights"], (grown, got)
    assert got["nodes"] > 5


def test_sharing_is_undone_after_capture():
    from torch._dynamo.variables import builder
    original = builder.clone_input
    with parameters_shared():
        with parameters_shared():                  # nested (two exports at once) is one patch
            assert builder.clone_input is not original
            p = torch.nn.Parameter(torch.ones(3))
            assert builder.clone_input(p) is p
            t = torch.ones(3)
            copy = builder.clone_input(t)
            assert copy is not t and torch.equal(copy, t)
        assert builder.clone_input is not original
    assert builder.clone_input is original


def test_capture_with_shared_parameters_matches_eager():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    ep = capture(net.eval(), (x,), strict=True, source=None)
    torch.testing.assert_close(ep.module()(x), net(x))
    for name, p in net.named_parameters():     # the exported program holds the model's own
        assert ep.state_dict[name].data_ptr() == p.data_ptr()
