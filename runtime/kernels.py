"""The Triton kernels of a CUDA artifact, as the runtime sees them (GPU and interpreter alike).

Each kernel has a launch spec, kernels/<name>.json, written at export: its parameters in order
(buffers read, buffers written, `aotc_err` when it indexes with runtime values, dim sizes), block
sizes, the grid as expressions over the plan's size symbols, and per arch the cubin with its
symbol, shared memory, warps and trailing scratch parameters.

A launcher is called from a plan as `launch(grid, *args)` with the kernel's tensors and sizes
in parameter order. Kernels that index with runtime values report an out-of-range index by
storing their error code into a one-element int32 flag that the plan allocates per call and
checks once, after its last step (`new_error_flag`, `check_error_flag`): one 4-byte read per
call, and only in plans that have such kernels.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from aotc.errors import ArtifactError
from aotc.runtime import format as fmt
from aotc.runtime.native import kernel_failed


class TritonKernels:
    """Launch specs of an artifact's kernels and the error-flag protocol; subclasses launch."""

    def __init__(self, path: Path, native: dict, device: torch.device):
        self.path, self.native, self.device = Path(path), native, device
        self.specs = {name: self._spec(name) for name in native.get("kernels", [])}
        self.codes = {s["error_code"]: n for n, s in self.specs.items() if s.get("error_code")}

    def _spec(self, name: str) -> dict:
        p = self.path / fmt.triton_launch_file(name)
        if not p.is_file():
            raise ArtifactError(f"launch metadata of kernel {name} is missing", where=str(p),
                                expected="kernels/<name>.json", found="no such file",
                                fix="re-export the model")
        return json.loads(p.read_bytes())

    def spec(self, name: str) -> dict:
        if name not in self.specs:
            raise ArtifactError(f"the plan launches kernel {name}, which the artifact lacks",
                                where=name, expected=sorted(self.specs), found=name,
                                fix="re-export the model")
        return self.specs[name]

    def new_error_flag(self) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.int32, device=self.device)

    def check_error_flag(self, flag: torch.Tensor) -> None:
        code = int(flag.item())
        if code:
            kernel_failed(self.codes.get(code, f"with error code {code}"))

    def kernel(self, name: str):
        raise NotImplementedError
