"""Targets: what an artifact is compiled for (`cpu`, `cuda:sm_90`, `cuda:sm_80,sm_90`)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from aotc.errors import UsageError

_FIX = "use 'cpu', 'cuda', or 'cuda:sm_XX[,sm_YY...]', e.g. cuda:sm_90"
# NVIDIA compute capabilities Triton compiles for (Volta and later; 'a': the arch-specific
# variant of 9.0 and later): an architecture outside it is refused before any compilation
ARCHS = (70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)


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
            _check_arch(a, text)
        return cls(device=device, archs=archs)

    def __str__(self) -> str:
        return self.device + (":" + ",".join(self.archs) if self.archs else "")

    def to_json(self, *, portable: bool) -> dict:
        """`portable`: the artifact holds no native kernels, so it runs on any device."""
        return {"device": self.device, "archs": list(self.archs), "portable": portable}


def _check_arch(arch: str, text: str) -> None:
    """A UsageError unless `arch` is sm_XX (sm_XXa from 9.0) of a known compute capability."""
    m = re.fullmatch(r"sm_(\d{2,3})(a?)", arch)
    if m is None or int(m[1]) not in ARCHS or (m[2] and int(m[1]) < 90):
        known = ", ".join(f"sm_{c}" for c in ARCHS)
        raise UsageError(f"unknown GPU architecture {arch!r} in target {text!r}",
                         where="--target", expected=f"one of {known} (sm_90a and later with "
                         "an 'a' suffix)", found=arch,
                         fix="name your GPU's compute capability, e.g. cuda:sm_80 (A100) or "
                             "cuda:sm_90 (H100); `nvidia-smi --query-gpu=compute_cap "
                             "--format=csv` prints it")
