"""The zoo with dynamic dims (`python -m benchmarks.zoo --dynamic`): each model exported once with
its batch dim dynamic (every input's dim 0, `batch` in 1..16) and, for token inputs, its
sequence dynamic (dim 1 of the integer inputs as long as the first one's, `seq` in
2..2*example), then checked against eager at the example sizes, at fresh inputs of those sizes
and at other sizes (batch 3 and 1, a shorter sequence): what "one artifact serves every size in
its range" has to hold on real architectures.
"""
from __future__ import annotations

import torch

BATCH_MAX = 16


def dynamic_shapes(inputs: tuple) -> tuple:
    """torch.export dynamic shapes for the zoo's inputs (see the module doc)."""
    batch = torch.export.Dim("batch", min=1, max=BATCH_MAX)
    tokens = [t for t in inputs if not t.is_floating_point() and t.dim() >= 2]
    seq = None
    if tokens and tokens[0].shape[1] >= 4:
        seq = torch.export.Dim("seq", min=2, max=2 * tokens[0].shape[1])
    out = []
    for t in inputs:
        dims = {0: batch} if t.dim() >= 1 and t.shape[0] >= 2 else {}
        if seq is not None and not t.is_floating_point() and t.dim() >= 2 \
                and t.shape[1] == tokens[0].shape[1]:
            dims[1] = seq
        out.append(dims)
    return tuple(out)


def resized(spec, size: str, dims: tuple, seed: int) -> list[tuple]:
    """Inputs at other sizes than the example's: batch 3 with the sequence 3 shorter, and
    batch 1 (a size torch.export never saw)."""
    out = []
    for batch, cut in ((3, 3), (1, 0)):
        inputs = spec.inputs(size, batch, torch.Generator().manual_seed(seed + batch))
        sliced = []
        for t, d in zip(inputs, dims):
            if 1 in d and cut:
                t = t[:, : t.shape[1] - cut].contiguous()
            sliced.append(t)
        out.append(tuple(sliced))
    return out
