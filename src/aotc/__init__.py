"""aotc: an ahead-of-time compiler and packager for PyTorch models.

    aotc.export(model, example_inputs, "model.aotc", **options) -> Path   # capture + compile
    m = aotc.load("model.aotc"); y = m(x)                                  # thin runtime

`import aotc` loads only the runtime; the exporter and codegen (torch.export, Dynamo) are
imported on the first call to `aotc.export`.
"""
from __future__ import annotations

__version__ = "0.1.0"

from aotc.errors import (AotcError, ArtifactError, ExportError, GuardError, LoweringError,
                         TargetError, UsageError, VerifyError)
from aotc.runtime import CompiledModule, load

__all__ = ["export", "load", "CompiledModule", "AotcError", "ArtifactError", "ExportError",
           "GuardError", "LoweringError", "TargetError", "UsageError", "VerifyError",
           "__version__"]


def export(model, example_inputs, path, *, dynamic_shapes=None, progress=None, **options):
    """Capture `model` on `example_inputs`, compile it, and write the artifact to `path`.

    `dynamic_shapes` is given exactly as to `torch.export.export` (`torch.export.Dim`s per input
    dim; by position or by forward's argument names). Options are those of
    `aotc.options.ExportOptions` (the same as the CLI's flags). `progress(message)`, if given,
    is called as each stage starts (the CLI prints these lines). Returns the artifact's path.
    """
    from aotc.api import export_module
    return export_module(model, example_inputs, path, dynamic_shapes=dynamic_shapes,
                         progress=progress, **options)
