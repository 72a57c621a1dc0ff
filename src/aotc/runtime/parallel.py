"""Loading a tensor-parallel artifact (format 8): this process's rank from torch.distributed.

`select_rank(artifact)` reads the default process group (which the caller initialised, e.g.
under `torchrun`), checks its world size against the artifact's, and narrows the artifact's
manifest to this rank's weights shards; everything after it loads as any artifact does. The
plans' `aotc::all_reduce` steps sum over that same group (runtime/aotc_ops.py), so every rank
must call the module with the same inputs, and gets the whole output.

`launched_group(path, command)` is for the CLI (`aotc run` and `aotc verify` under `torchrun
--nproc-per-node N --no-python aotc ...`): it makes the default process group of a
tensor-parallel artifact from the environment torchrun gives each process, and destroys it
after; Python callers initialise their own group.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

from aotc.errors import TargetError

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")   # what torchrun sets


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
                              f"in each of {world} processes ({launch}); from the CLI: "
                              f"{launch} --no-python aotc run|verify ARTIFACT")
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


def world_size(path) -> int | None:
    """The world size of the artifact at `path`, None if it is not tensor-parallel: read from
    its manifest alone, no hash or signature checked (loading it checks them)."""
    from aotc.artifact.reader import Artifact
    peek = Artifact(path, verify_hashes=False, signature_policy=False)
    try:
        tp = peek.manifest.tensor_parallel
    finally:
        peek.close()
    return None if tp is None else tp.world_size


@contextlib.contextmanager
def launched_group(path, command: str):
    """The process group of a tensor-parallel artifact run by `aotc <command>` under torchrun:
    gloo for CPU tensors (and NCCL for CUDA ones where torch sees a GPU, each process on the
    GPU of its LOCAL_RANK), made before loading and destroyed after. Yields (rank, world size);
    (None, None) for an artifact that is not tensor-parallel or where a group exists."""
    import torch
    import torch.distributed as dist
    world = world_size(path)
    if world is None or (dist.is_available() and dist.is_initialized()):
        yield None, None
        return
    missing = [k for k in LAUNCH_ENV if k not in os.environ]
    if missing:
        raise TargetError(f"the artifact is split over {world} ranks (tensor-parallel) and this "
                          "process was not started by a launcher", where="environment",
                          expected=f"{', '.join(LAUNCH_ENV)} (torchrun sets them)",
                          found=f"no {', '.join(missing)}",
                          fix=f"torchrun --nproc-per-node {world} --no-python aotc {command} "
                              f"{path}")
    backend = "gloo"
    if torch.cuda.is_available():
        backend = "cpu:gloo,cuda:nccl"
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()
