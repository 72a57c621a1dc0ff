"""Kernels of one shape: sources that differ only in names compile to the same code.

A model's repeated blocks (a decoder's or an encoder's layers) lower to the same kernels over
different buffers. Both backends compile each shape once: codegen/triton/build.py gives the
kernels of one shape the first one's cubin, codegen/cpp gives them the first one's function in
the library's kernel table. Parameters are ordered by their first use in a kernel's body (not
by name), so that the buffers of two layers take the same places.
"""
from __future__ import annotations

import re


def numbered(text: str, names: list[str], comment: str) -> str:
    """`text` without its comment lines (lines starting with `comment`: they name buffers and
    compile to nothing), each of `names` (the kernel's name, then its parameters in order)
    replaced by its place: equal for two kernels exactly when they differ only in names."""
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(comment))
    if not names:
        return code
    where = {n: f"aotc_p{i}" for i, n in enumerate(names)}
    return re.sub(r"\b(" + "|".join(map(re.escape, where)) + r")\b",
                  lambda m: where[m.group(1)], code)


def size_names(text: str) -> list[str]:
    """The size symbols a kernel's text uses (`s_<name>`, as the printers write a dim size),
    sorted: the kernel takes them as its last arguments, in this order."""
    return sorted(set(re.findall(r"\bs_(\w+)", text)))


def first_use_order(names, text: str) -> list[str]:
    """`names` in the order `text` first names them (names it never mentions last, sorted)."""
    found = {n: i for i, n in enumerate(dict.fromkeys(re.findall(r"\bbuf\d+\b", text)))}
    return sorted(names, key=lambda n: (found.get(n, len(found)), n))
