"""Loading a tensor-parallel artifact (format 8): this process's rank from torch.distributed.

`select_rank(artifact)` reads the default process group (which the caller initialised, e.g.
under `torchrun`), checks its world size against the artifact's, and narrows the artifact's
manifest to this rank's weights shards; everything after it loads as any artifact does. The
plans' `aotc::all_reduce` steps sum over that same group (runtime/aotc_ops.py), so every rank
must call the module with the same inputs, and gets the whole output.
"""
from __future__ import annotations

import dataclasses

from aotc.errors import TargetError


def select_rank(artifact) -> int | None:
    """This process's rank, with `artifact.manifest` narrowed to its weights; None for an
    artifact that is not tensor-parallel."""
    tp = artifact.manifest.tensor_parallel
    if tp is None:
        return None
    import torch.distributed as dist
    world = tp.world_size
    launch = f"torchrun --nproc-per-node {world}"
    if not (dist.is_available() and dist.is_initialized()):
        raise TargetError(f"the artifact is split over {world} ranks (tensor-parallel) and no "
                          "torch.distributed process group is initialised",
                          where="torch.distributed default process group",
                          expected=f"a process group of world size {world}", found="none",
                          fix=f"call torch.distributed.init_process_group() before aotc.load, "
                              f"in each of {world} processes ({launch})")
    if dist.get_world_size() != world:
        raise TargetError(f"the artifact is split over {world} ranks; the process group has "
                          f"{dist.get_world_size()}", where="torch.distributed world size",
                          expected=world, found=dist.get_world_size(),
                          fix=f"run {world} processes ({launch}), or re-export with "
                              f"--tensor-parallel {dist.get_world_size()}")
    rank = dist.get_rank()
    mine = tp.ranks[rank]
    weights = dataclasses.replace(artifact.manifest.weights, shards=mine.shards, map=mine.map)
    artifact.manifest = dataclasses.replace(artifact.manifest, weights=weights)
    artifact.rank = rank
    return rank
