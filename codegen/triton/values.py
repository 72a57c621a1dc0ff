"""The values a Triton kernel's writer prints: blocks over the axes "x" (XBLOCK rows) and "r"
(an R block), and where a node's body runs."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

X, XR = frozenset("x"), frozenset("xr")


@dataclass(frozen=True, slots=True)
class TVal:
    expr: str
    dtype: torch.dtype          # IR dtype; the value is held in value_dtype(dtype)
    axes: frozenset             # block axes the value varies over: subset of {"x", "r"}
    const: object = None        # the Python value of a constant (folded at codegen time)


@dataclass
class Scope:
    """Where a node's body runs: its block (R block name, masks) and its loop variables."""
    block: "NodeBlock"
    xmask: str | None
    axes: dict = field(default_factory=dict)      # sympy var -> frozenset of axes

    def shape(self, axes) -> str:
        return {frozenset(): "[1, 1]", X: "[XBLOCK, 1]", frozenset("r"): f"[1, {self.block.rb}]",
                XR: f"[XBLOCK, {self.block.rb}]"}[frozenset(axes)]
