"""Write artifact/schema/extern_ops.txt: the ATen ops a plan may call, one `aten::name.overload`
per line.

A plan calls whatever ATen ops survive export's decomposition without a lowering, so the table
is every ATen overload this rule admits, taken from each torch the script runs under and merged
with the ops already listed (run it under every supported torch to cover them all):
  * functional overloads (no argument written, no `out=` form) and views, plus the few in-place
    ops aotc's plans use to update state (MUTATING);
  * none whose name says it skips checks or takes raw memory (DENY): `_unsafe` ops index
    without bounds checks, `from_file` reads a path, fbgemm and mkldnn ops reinterpret tensor
    bytes as packed C++ objects, nested/jagged ops trust offset tensors.

    python scripts/extern_ops.py          # merge this torch's ops into the table
The runtime refuses any other op name before calling anything (artifact/schema/ops.py), and
codegen refuses to export one (so an artifact never names an op its loader will refuse).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

TABLE = Path(__file__).resolve().parents[1] / "src" / "aotc" / "artifact" / "schema" / "extern_ops.txt"
MUTATING = {"copy_", "index_copy_", "index_put_", "fill_", "zero_", "masked_fill_",
            "scatter_", "scatter_add_", "slice_scatter"}
DENY = re.compile(r"unsafe|from_file|fbgemm|mkldnn|nested|jagged|_print|_reshape_alias|_debug|"
                  r"_cufft|_cslt|semi_structured|int4pack|int8pack|segment_reduce|"
                  r"_foreach|_fused_|record_stream|_copy_from|resize|set_|_cummax_helper|"
                  r"_cummin_helper|_amp_|_pin_memory|_efficientzerotensor|_make_dep_token|sparse|_validate_|"
                  r"sym_constrain|_assert_scalar|_functional_assert")
HEADER = ("# ATen ops a plan may call (scripts/extern_ops.py writes this file; see its doc).\n")


def admitted(name: str, overload: str, schema) -> bool:
    if DENY.search(name) or overload == "out" or overload.endswith("_out"):
        return False
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return not writes or name in MUTATING


def ops_of_this_torch() -> set[str]:
    """Every registered aten overload (the dispatcher's schemas, not only the ops Python has
    touched) that the rule admits."""
    out = set()
    for schema in torch._C._jit_get_all_schemas():
        ns, _, name = schema.name.partition("::")
        overload = schema.overload_name or "default"
        if ns == "aten" and re.fullmatch(r"[a-z_][a-z0-9_]*", name) \
                and admitted(name, overload, schema):
            out.add(f"aten::{name}.{overload}")
    return out


def main() -> None:
    old = set()
    if TABLE.is_file():
        old = {line.strip() for line in TABLE.read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    ops = sorted(old | ops_of_this_torch())
    TABLE.write_text(HEADER + "\n".join(ops) + "\n")
    print(f"{TABLE}: {len(ops)} ops ({len(ops) - len(old)} new from torch {torch.__version__})")


if __name__ == "__main__":
    main()
