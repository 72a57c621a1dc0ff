"""Value-dependent sizes on a GPU (format 16): models of tests/test_value_sizes.py exported for
CUDA, run with both runners against eager on the GPU, zero selected rows included.

    python3 scripts/gpu_value_sizes.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import aotc  # noqa: E402
from test_value_sizes import Adapters, Prefix, Selected  # noqa: E402


def err(got, want) -> float:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert [g.shape for g in got] == [w.shape for w in want], "shapes differ"
    return max(((g.float() - w.float()).abs().max().item() if g.numel() else 0.0)
               for g, w in zip(got, want))


def main() -> int:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    cases = [("adapters", Adapters().eval(), lambda: (torch.randn(2, 8, 16),
                                                       torch.randint(0, 3, (2, 8))),
              [lambda: (torch.randn(2, 8, 16), torch.full((2, 8), 7))]),
             ("selected", Selected(), lambda: (torch.randn(3, 5, 4), torch.rand(3, 5) > 0.5),
              [lambda: (torch.randn(3, 5, 4), torch.zeros(3, 5, dtype=torch.bool))]),
             ("prefix", Prefix(), lambda: (torch.randn(2, 10), torch.tensor([3, 5])),
              [lambda: (torch.randn(2, 10), torch.tensor([0, 0]))])]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, make, extra in cases:
            x = make()
            path = aotc.export(model, x, Path(tmp) / f"{name}.aotc", target="cuda")
            model = model.to(dev)
            for runner in ("python", "cpp"):
                m = aotc.load(path, runner=runner)
                for args in [x, make(), *(e() for e in extra)]:
                    args = tuple(a.to(dev) for a in args)
                    with torch.no_grad():
                        e = err(m(*args), model(*args))
                    ok = e < 1e-4
                    bad += not ok
                    print(f"{name} {runner} ({m.runtime[:6]}, graphs {m.graph_status()}): "
                          f"max error {e:.2e} {'ok' if ok else 'MISMATCH'}")
    print("value sizes on the GPU:", "all match" if not bad else f"{bad} mismatches")
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
