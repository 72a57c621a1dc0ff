"""Targets: what an artifact is compiled for (`cpu`, `cuda:sm_90`, `cuda:sm_80,sm_90`)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from aotc.errors import UsageError

_FIX = "use 'cpu', 'cuda', or 'cuda:sm_XX[,sm_YY...]', e.g. cuda:sm_90"


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    device: str
    archs: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Target":
        device, _, rest = text.strip().lower().partition(":")
        if device not in ("cpu", "cuda") or (device == "cpu" and rest):
            raise UsageError(f"unknown target {text!r}", where="--target",
                             expected="cpu | cuda[:sm_XX,...]", found=text, fix=_FIX)
        archs = tuple(a.strip() for a in rest.split(",")) if rest else ()
        for a in archs:
            if not re.fullmatch(r"sm_\d{2,3}a?", a):
                raise UsageError(f"unknown GPU architecture {a!r} in target {text!r}",
                                 where="--target", expected="sm_XX, e.g. sm_80 or sm_90",
                                 found=a, fix=_FIX)
        return cls(device=device, archs=archs)

    def __str__(self) -> str:
        return self.device + (":" + ",".join(self.archs) if self.archs else "")

    def to_json(self, *, portable: bool) -> dict:
        """`portable`: the artifact holds no native kernels, so it runs on any device."""
        return {"device": self.device, "archs": list(self.archs), "portable": portable}
