"""The fixed table of ATen ops a plan may call (extern_ops.txt, written by
scripts/extern_ops.py): functional ATen overloads and views, a few in-place ops that update
state, and none that skips its checks or reads raw memory or files. An op name outside the
table is refused when a plan is parsed, before any op is resolved; codegen checks the same
table at export."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).with_name("extern_ops.txt")


@lru_cache(maxsize=1)
def extern_ops() -> frozenset[str]:
    lines = TABLE.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and line[0] != "#")


AOTC_OPS = frozenset({"aotc::decode_attention.default",       # runtime/aotc_ops.py
                      "aotc::decode_attention_write.default",
                      "aotc::all_reduce.default", "aotc::all_gather.default",
                      "aotc::fft.default", "aotc::sdpa_backward.default"})


def is_extern_op(name: str) -> bool:
    return name in extern_ops() or name in AOTC_OPS
