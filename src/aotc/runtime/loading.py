"""Loading an artifact's weights onto a device: on the CPU, views of the private mappings being
hashed (artifact/shards.py); on a GPU, device tensors filled from checked chunks
(runtime/transfer.py)."""
from __future__ import annotations

import torch

from aotc.artifact.shards import Loading, start_mapped, resolve_aliases
from aotc.runtime.transfer import start_stream


def start_weights(artifact, device: torch.device) -> Loading:
    """The artifact's weights by every name the plans use (tied aliases resolved), loading:
    on the CPU, views of the private mappings being hashed; on a GPU, device tensors being
    filled from checked chunks (runtime/transfer.py)."""
    if device.type == "cpu":
        loading = start_mapped(artifact)
    else:
        loading = start_stream(artifact, device)
    try:
        resolve_aliases(loading.weights, artifact.manifest)
    except BaseException:
        loading.close()
        raise
    return loading


def load_weights(artifact, device: torch.device) -> dict[str, torch.Tensor]:
    """`start_weights`, waited for: every byte checked."""
    return start_weights(artifact, device).wait()
