"""aotc.runtime: load an artifact directory and run it.

Importable without the exporter or codegen: it loads no Dynamo, Inductor, AOTAutograd, export
tracing or Triton module, nor sympy.
"""
from __future__ import annotations

import contextlib
import gc

from aotc.artifact import format
from aotc.runtime.graphs import MAX_GRAPHS
from aotc.runtime.module import CompiledModule, resolve_device
from aotc.runtime.parallel import select_rank

__all__ = ["load", "CompiledModule", "format"]


def load(path, device=None, *, check_guards: bool = True, verify_hashes: bool = True,
         interpret: bool = False, cuda_graph: bool | None = None,
         cuda_graph_cache: int = MAX_GRAPHS, trusted_keys=None, weights=None,
         runner: str | None = None, isa: str | None = None) -> CompiledModule:
    """Load an artifact written by `aotc export`.

    The manifest, its format version and every field of it, and the size and sha256 of every
    file are checked before anything else is read, from the bytes that are then used
    (artifact/reader.py). `trusted_keys` (one key or a list: EC public keys or CA certificates
    for OMS signatures, model.sig; Ed25519 keys for signatures.json; PEM files or text, base64
    or raw bytes; AOTC_TRUSTED_KEYS adds files and directories of them) makes a valid signature
    by one of them mandatory, and a policy yielding no key refuses the load (docs/signing.md).
    `device` defaults to the device the artifact was built for (portable, extern-only artifacts
    load on any). Guards are checked on every call unless `check_guards=False`.

    `cuda_graph`: on a GPU, each entry is captured into a CUDA graph and replayed afterwards
    (one launch per call instead of one per kernel), after checking that the replay gives the
    same results as a plain run: a static entry on its first call; an entry with dynamic dims
    per set of sizes, on the second call with those sizes, keeping the `cuda_graph_cache` most
    recently used graphs. None (the default) does so where it can, False never, True insists
    (an error says why it cannot). `m.graph_status()` tells what each entry does. Training
    artifacts capture their forward and backward (runtime/train_graphs.py).

    `interpret=True` is a testing aid for machines without a GPU: a CUDA artifact's Triton kernels
    run on CPU tensors through Triton's interpreter (slow; needs triton installed; `device` must
    be "cpu" or None). It runs the artifact's kernel sources as Python (checked to be Triton
    kernels and nothing else): never use it on an artifact you do not trust.

    `weights`: a safetensors file of the same model's state_dict (a fine-tuned variant) loaded
    in place of the artifact's own, strictly (`load_state_dict(..., strict=True)`), reusing
    its kernels and plans; `aotc swap-weights` writes such a variant as an artifact.

    `runner`: which plan runner runs the entries (runtime/cpp_runner.py). None (the default)
    picks aotc's C++ runner for CPU and CUDA plans where it is installed, else the Python runner;
    "python" forces the Python runner, "cpp" insists on the C++ one. `m.runtime` says which
    runs, and why the Python one does.

    A tensor-parallel artifact (`--tensor-parallel N`) loads this process's rank's weights, the
    rank and world size read from torch.distributed's default process group, which must exist
    and have N ranks (runtime/parallel.py); every rank then calls it with the same inputs.

    `isa`: of a CPU artifact's kernel builds, the level named (e.g. "x86-64-v2") rather than
    the best this CPU supports; `m.library.level` says which.
    """
    from aotc.artifact.reader import Artifact
    with _collection_paused():
        artifact = Artifact(path, verify_hashes=verify_hashes, trusted_keys=trusted_keys,
                            isa=isa)
        try:
            select_rank(artifact)     # tensor-parallel artifacts: this rank's weights
            dev = resolve_device(artifact.manifest, device, interpret)
            module = _module(artifact, dev, check_guards=check_guards, cuda_graph=cuda_graph,
                             cuda_graph_cache=cuda_graph_cache, runner=runner)
        except BaseException:
            artifact.close()
            raise
    if weights is not None:
        from aotc.runtime.statedict import read_weights_file
        module.load_state_dict(read_weights_file(weights), strict=True)
    return module


@contextlib.contextmanager
def _collection_paused():
    """Cyclic garbage collection paused while an artifact is read, parsed and bound (and
    resumed after, unless the caller had it off): the parse allocates many small objects that
    hold no cycles (refcounting frees them), and each collection they set off walks the whole
    heap, torch's included; on BERT-base that cost more than the parse (benchmarks/
    runner_check.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _module(artifact, dev, *, cuda_graph_cache, **kwargs) -> CompiledModule:
    """The loaded module of the artifact's kind: a generator, a training artifact, or a plain
    inference artifact."""
    if artifact.manifest.generation is not None:
        from aotc.runtime.generate import GenerativeModule
        return GenerativeModule(artifact, dev, cuda_graph_cache=cuda_graph_cache, **kwargs)
    if artifact.manifest.training is not None:
        from aotc.runtime.training import TrainableModule
        return TrainableModule(artifact, dev, **kwargs)
    return CompiledModule(artifact, dev, cuda_graph_cache=cuda_graph_cache, **kwargs)
