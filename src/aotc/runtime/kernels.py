"""The Triton kernels of a CUDA artifact, as the runtime sees them (GPU and interpreter alike).

Each kernel has a launch spec, kernels/<name>.json, written at export and read through the
schema (artifact/schema/launch.py): its parameters in order (buffers read, buffers written,
`aotc_err` when it indexes with runtime values, dim sizes), block sizes, the grid as expressions
over the plan's size symbols, and per arch the cubin with its symbol, shared memory, warps and
trailing scratch parameters. A plan step is bound to a kernel only if it passes exactly the
buffers (count and dtypes) and sizes the spec declares.

A launcher is called from a plan as `launch(grid, *args)` with the kernel's tensors and sizes
in parameter order. Kernels that index with runtime values report an out-of-range index by
storing their error code into a one-element int32 flag that the plan allocates per call and
checks once, after its last step (`new_error_flag`; the plan function reads it): one 4-byte
read per call, and only in plans that have such kernels.
"""
from __future__ import annotations

import torch

from aotc.errors import ArtifactError

POINTER_DTYPES = {"*fp64": "float64", "*fp32": "float32", "*fp16": "float16",
                  "*bf16": "bfloat16", "*i64": "int64", "*i32": "int32", "*i16": "int16",
                  "*i8": "int8", "*u8": "uint8", "*i1": "bool", "*fp8e4nv": "float8_e4m3fn",
                  "*fp8e5": "float8_e5m2"}


def launch_specs(manifest, kernels, read, version: int) -> dict:
    """The launch specs of `kernels` (names) in an artifact of format `version`, kernel name ->
    LaunchSpec, read through the schema; `read`: artifact-relative path -> bytes."""
    from aotc.artifact import format as fmt
    from aotc.artifact.reader import load_json_obj
    from aotc.artifact.schema import parse_launch
    symbols = set().union(*(set(e.symbols) for e in manifest.entries.values()))
    return {name: parse_launch(load_json_obj(read(rel), rel), name, symbols, version)
            for name in kernels for rel in (fmt.triton_launch_file(name),)}


class TritonKernels:
    """Launch specs of an artifact's kernels and the error-flag protocol; subclasses launch."""

    def __init__(self, artifact, native, device: torch.device):
        self.artifact, self.native, self.device = artifact, native, device
        self.specs = launch_specs(artifact.manifest, native.kernels, artifact.read,
                                  artifact.version)

    def spec(self, name: str):
        if name not in self.specs:
            raise ArtifactError(f"the plan launches kernel {name}, which the artifact lacks",
                                where=name, expected=sorted(self.specs)[:8], found=name,
                                fix="re-export the model")
        return self.specs[name]

    def check_step(self, name: str, nargs: int, nsizes: int, dtypes: list[str]) -> None:
        """Refuse a plan step that passes kernel `name` other buffers or sizes than its launch
        spec declares (a kernel must never index memory it was not compiled for)."""
        spec = self.spec(name)
        buffers = [p for p in spec.params if p.name in (*spec.inputs, *spec.outputs)]
        want = [POINTER_DTYPES.get(p.type, p.type) for p in buffers]
        if (len(buffers), len(spec.sizes), want) != (nargs, nsizes, list(dtypes)):
            raise ArtifactError(f"the plan launches kernel {name} with arguments its launch "
                                "spec does not declare", where=f"plan step {name}",
                                expected=f"{len(buffers)} buffers {want}, {len(spec.sizes)} "
                                         "sizes",
                                found=f"{nargs} buffers {list(dtypes)}, {nsizes} sizes",
                                fix="re-export the model (plan and kernels do not match)")

    def new_error_flag(self) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.int32, device=self.device)

    def kernel(self, name: str, nargs: int, nsizes: int, dtypes: list[str]):
        raise NotImplementedError

    def runner_launcher(self, name: str, nargs: int, nsizes: int, dtypes: list[str]):
        """What the C++ runner launches kernel `name` with (runtime/cpp/launch.h): by default
        the Python launcher itself, which the runner calls back (the interpreter)."""
        return self.kernel(name, nargs, nsizes, dtypes)
