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


def export(model, example_inputs=None, path=None, *, dynamic_shapes=None, progress=None,
           **options):
    """Capture `model` on `example_inputs`, compile it, and write the artifact to `path`.

    `dynamic_shapes` is given exactly as to `torch.export.export` (`torch.export.Dim`s per input
    dim; by position or by forward's argument names). Options are those of
    `aotc.options.ExportOptions` (the same as the CLI's flags). `progress(message)`, if given,
    is called as each stage starts (the CLI prints these lines). Returns the artifact's path.

    `model` may also be a Hugging Face model folder (written by `save_pretrained`): then it is
    exported for its task with its real weights and tokenizer, and takes no example inputs,
    `aotc.export("./tiny-llama", path="llm.aotc", task="text-generation")`, with the options of
    `aotc.options.FolderOptions` too (task, batch, seq_len, image_size; docs/huggingface.md).
    """
    import os
    from aotc.exporter.hf_folder import is_model_folder
    if isinstance(model, (str, os.PathLike)) and is_model_folder(model):
        from aotc.api import export_folder
        if example_inputs is not None or dynamic_shapes is not None:
            raise UsageError("a model folder makes its own example inputs and dynamic dims",
                             where="aotc.export(folder, ...)", expected="no example_inputs "
                             "or dynamic_shapes", found="given", fix="pass path=... and the "
                             "folder options (task, batch, seq_len, image_size)")
        return export_folder(model, path, progress=progress, **options)
    if path is None:
        raise UsageError("aotc.export needs the artifact's path", where="aotc.export",
                         expected="path=...", found=None, fix="pass the output path")
    from aotc.api import export_module
    return export_module(model, example_inputs, path, dynamic_shapes=dynamic_shapes,
                         progress=progress, **options)
