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


# aotc's own ops (runtime/aotc_ops.py implements them; the C++ runner those it can run):
# name -> (its arguments' kinds, how many are required). Kinds: "T" a tensor slot, "i" an int,
# "f" a number; the ones after the required count may be left out. Both runners check a plan's
# calls against this one table (the C++ one through rules.h, scripts/gen_cpp_rules.py).
AOTC_OPS = {"aotc::decode_attention.default": ("TTTTfifT", 5),
            "aotc::decode_attention_write.default": ("TTTTTTfifT", 7),
            "aotc::all_reduce.default": ("T", 1),
            "aotc::all_gather.default": ("Tii", 3),
            "aotc::fft.default": ("Tiii", 3),
            "aotc::sdpa_backward.default": ("TTTTifiT", 7)}


def is_extern_op(name: str) -> bool:
    return name in extern_ops() or name in AOTC_OPS
