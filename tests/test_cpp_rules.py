"""The rules both front ends enforce are defined once (artifact/schema/rules.py) and generated
into the C++ front end's header (runtime/cpp/frontend/rules.h, scripts/gen_cpp_rules.py): the
committed header is the generator's output, and Python uses the same definitions."""
from __future__ import annotations

import subprocess
import sys

from conftest import AOTC_ROOT


def test_the_generated_header_is_current():
    done = subprocess.run([sys.executable, str(AOTC_ROOT / "scripts/gen_cpp_rules.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_header_is_what_the_generator_renders_from_the_rules():
    sys.path.insert(0, str(AOTC_ROOT / "scripts"))
    try:
        import gen_cpp_rules
    finally:
        sys.path.pop(0)
    text = gen_cpp_rules.render()
    from aotc.artifact.isa import ORDER
    from aotc.artifact.schema import manifest, rules
    assert all(f'{{"{level}", ' in text for level in ORDER)
    assert f"kMaxStateBytes = {rules.MAX_STATE_BYTES}ull" in text
    assert rules.NO_USABLE_KEY["found"] in text and rules.PRIVATE_KEY["what"] in text
    assert manifest.MAX_STATE_BYTES is rules.MAX_STATE_BYTES and manifest.MAX_DIM is rules.MAX_DIM


def test_the_runner_file_fields_are_what_export_writes(mlp_artifact):
    import json
    from aotc.artifact import format as fmt
    from aotc.artifact.schema.rules import RUNNER_FIELDS
    doc = json.loads((mlp_artifact / fmt.runner_file("forward")).read_bytes())
    assert sorted(doc) == sorted(RUNNER_FIELDS)   # written with sorted keys


def test_the_plan_rules_are_the_schemas():
    """What the C++ front end checks plans and the manifest by (frontend/plan_check.cpp,
    manifest_check.cpp, expr_check.cpp) is rendered from the Python schema's own definitions."""
    sys.path.insert(0, str(AOTC_ROOT / "scripts"))
    try:
        import gen_cpp_rules
    finally:
        sys.path.pop(0)
    text = gen_cpp_rules.render()
    from aotc.artifact.schema import expr, fields, manifest, plan
    from aotc.artifact.schema.ops import AOTC_OPS
    from aotc.artifact.schema.types import DTYPE_SET
    for keys in (plan.PLAN_KEYS, plan.KERNEL_KEYS, plan.CALL_KEYS, manifest.ENTRY_KEYS,
                 manifest.MANIFEST_KEYS):
        assert all(f'    "{k}",' in text for k in keys[0] + keys[1])
    assert all(f'"{x}"' in text for x in (*AOTC_OPS, *DTYPE_SET, *expr.KEYWORDS))
    assert f"kExprMaxNodes = {expr.MAX_NODES};" in text and \
        f"kMaxJsonBytes = {fields.MAX_JSON_BYTES};" in text
    assert plan.KERNEL_NAME.pattern[:-2] in text.replace("\\\\", "\\")
