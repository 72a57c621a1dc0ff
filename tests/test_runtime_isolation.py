"""`import aotc` and loading/running an artifact must not pull in the compiler stack."""
from __future__ import annotations

import json
import textwrap

import pytest

from conftest import run_python

FORBIDDEN = ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd", "torch.export",
             "triton", "sympy", "aotc.exporter", "aotc.codegen")

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    baseline = set(sys.modules)
    import aotc.runtime
    import aotc
    {extra}
    calls = 0
    for path in sys.argv[1:]:
        m = aotc.load(path)
        out = m(*m.random_inputs())
        calls += 1
    print(json.dumps({{"new": sorted(set(sys.modules) - baseline), "calls": calls}}))
""")


def _forbidden(names):
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))


def _new_modules(paths, extra=""):
    proc = run_python(SCRIPT.format(extra=extra), *paths)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["calls"] == len(paths)
    return result["new"]


@pytest.fixture(scope="module")
def artifacts(exported):
    names = ["mlp", "cnn", "transformer"]
    try:
        import transformers  # noqa: F401
        names += ["gpt2", "bert"]
    except ImportError:
        pass
    return [exported(n).path for n in names]


def test_load_and_call_import_no_compiler_modules(artifacts):
    new = _new_modules(artifacts)
    assert "aotc.runtime" in new and "aotc.runtime.module" in new   # the script did load aotc
    assert _forbidden(new) == []


def test_detector_catches_the_exporter(artifacts):
    """Control: importing the export pipeline in the same script is detected."""
    new = _new_modules(artifacts[:1], extra="import aotc.api")
    bad = _forbidden(new)
    assert "aotc.exporter" in bad and "aotc.codegen" in bad
