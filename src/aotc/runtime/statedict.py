"""`state_dict()` and `load_state_dict()` of inference artifacts, and weights files read for a swap.

Keys are the model's own state_dict keys, as the manifest records them (parameters and
persistent buffers; tied names share one stored tensor); non-persistent buffers and constants
the plans need are stored too but are not state, so no state dict carries them. Values are
views of the loaded weights in the model's layout: a weight stored transposed for the CPU's
matmuls is handed out as a transposed view of what is stored.

Loading checks every key, shape and dtype first, as torch's `load_state_dict` does and with its
messages, and writes nothing when anything is wrong (torch stops halfway). Then it copies into
the loaded weights in place and recomputes in place what the plans derived from them at load
(channels-last copies, layouts a kernel was compiled for), so data pointers held by plans and
CUDA graphs stay valid. Floating values are cast to the artifact's dtype, as torch's copy does;
a change of kind (floating, integer, bool, complex) is refused. A tied group is satisfied by
any one of its keys, so safetensors files that store tied weights once load too.
"""
from __future__ import annotations

import mmap
import os
import stat
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch.nn.modules.module import _IncompatibleKeys

from aotc.errors import StateDictError, UsageError
from aotc.artifact.quant import quantize_state
from aotc.artifact.weights import tensors


class StateMap:
    """Which stored tensor each state_dict key is, and in which layout the model sees it."""

    def __init__(self, manifest, weights: dict):
        """`weights`: the loaded weights by every name (aliases included)."""
        w = manifest.weights
        keys = w.state_dict
        if keys is None:      # format < 7 recorded no keys: every name is taken to be state
            t = manifest.training
            keys = (*t.params, *t.buffers) if t is not None else tuple(sorted(weights))
        self.keys = tuple(keys)
        self.stored = {k: w.stored(k) for k in self.keys}
        self.transposed = frozenset(w.transposed)
        q = manifest.quantization
        self.quantized = q.layers if q is not None else {}

    def expand(self, state: dict) -> dict:
        """`state` with the full-precision weight of each quantized layer quantized as export
        did (artifact/quant.py); keys already quantized pass through."""
        return quantize_state(state, self.quantized) if self.quantized else state

    def view(self, key: str, weights: dict) -> torch.Tensor:
        """Key `key`'s tensor as the model holds it: a view of the stored tensor."""
        t = weights[self.stored[key]]
        return t.t() if self.stored[key] in self.transposed else t


@dataclass(frozen=True, slots=True)
class Copy:
    key: str
    stored: str
    source: torch.Tensor


def state_dict(smap: StateMap, weights: dict) -> OrderedDict:
    return OrderedDict((k, smap.view(k, weights).detach()) for k in smap.keys
                       if smap.stored[k] in weights)


def _kind(dtype: torch.dtype) -> str:
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "floating"
    return "bool" if dtype == torch.bool else "integer"


def _quoted(keys) -> str:
    return ", ".join('"' + k + '"' for k in keys)


def check(smap: StateMap, weights: dict, state: dict, strict: bool, owner: str):
    """(copies to make, missing keys, unexpected keys); a StateDictError listing every problem
    as torch words it (missing and unexpected keys only when `strict`). A quantized artifact
    takes its quantized layers' weights in full precision (quantized here) or quantized."""
    state = smap.expand(state)
    present = {smap.stored[k] for k in state if k in smap.stored}
    missing = [k for k in smap.keys if smap.stored[k] not in present]
    unexpected = [k for k in state if k not in smap.stored]
    errors, copies = [], []
    for key, value in state.items():
        if key not in smap.stored:
            continue
        if not isinstance(value, torch.Tensor):
            errors.append(f'While copying the parameter named "{key}", expected torch.Tensor '
                          f"or Tensor-like object from checkpoint but received {type(value)}")
            continue
        have = smap.view(key, weights)
        if value.shape != have.shape:
            errors.append(f"size mismatch for {key}: copying a param with shape {value.shape} "
                          f"from checkpoint, the shape in current model is {have.shape}.")
        elif _kind(value.dtype) != _kind(have.dtype):
            errors.append(f"dtype mismatch for {key}: copying a param of dtype {value.dtype} "
                          f"from checkpoint, the dtype in current model is {have.dtype}.")
        else:
            copies.append(Copy(key, smap.stored[key], value))
    if strict:
        if unexpected:
            errors.insert(0, f"Unexpected key(s) in state_dict: {_quoted(unexpected)}. ")
        if missing:
            errors.insert(0, f"Missing key(s) in state_dict: {_quoted(missing)}. ")
    if errors:
        raise StateDictError(f"Error(s) in loading state_dict for {owner}:\n\t"
                             + "\n\t".join(errors), where="load_state_dict",
                             expected=f"the {len(smap.keys)} keys of the model's state_dict "
                                      "with their shapes", found=f"{len(state)} keys, "
                             f"{len(errors)} problem(s)",
                             fix="load a state dict of the model this artifact was exported "
                                 "from (same architecture and config), or pass strict=False "
                                 "to skip missing and unexpected keys")
    return copies, missing, unexpected


def load_into(module, state: dict, strict: bool = True) -> _IncompatibleKeys:
    """CompiledModule.load_state_dict: check, copy in place, refresh what plans derived."""
    smap = StateMap(module.manifest, module.weights)
    copies, missing, unexpected = check(smap, module.weights, state, strict, "CompiledModule")
    cuda = module.device.type == "cuda"
    if cuda:   # calls still in flight read the old weights; copies must not overtake them
        torch.cuda.synchronize(module.device)
    with torch.no_grad():
        for c in copies:
            smap.view(c.key, module.weights).copy_(c.source)
        for entry in module.entries.values():
            entry.function.refresh()
    if cuda:
        torch.cuda.synchronize(module.device)
    return _IncompatibleKeys(missing, unexpected)


def read_weights_file(path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (views of a private mapping), read with the checked reader
    (artifact/weights.py): no pickle, the header checked before any tensor is made."""
    try:   # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise UsageError(f"cannot read weights file {path}: {os.strerror(e.errno)}",
                         where=str(path), expected="a safetensors file",
                         found=os.strerror(e.errno),
                         fix="pass the path of a .safetensors file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"weights file {path} is not a regular file", where=str(path),
                             expected="a safetensors file (a regular file)",
                             found="a directory" if stat.S_ISDIR(st.st_mode) else
                             "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a special file",
                             fix="pass the path of a .safetensors file")
        size = st.st_size
        data = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE) if size else b""
    finally:
        os.close(fd)
    return tensors(data, str(path))
