"""The three systems of the generation benchmark, each with its own cache and the same
interface: prefill(ids) -> logits, decode(ids) -> logits, reset(), and greedy(ids, n): each
system's own greedy loop, an iterator of n steps' tokens [batch, 1] after a prefill (the torch
systems pick with an argmax inside the step, compiled with it for reduce-overhead, as
gpt-fast-style decoding does; aotc through its module's `stream`)."""
from __future__ import annotations

import copy
import time

import torch

import aotc
from aotc.exporter.generate import DecodeStep, Generator, PrefillStep, adapt, reset_state
from aotc.nn import set_mode


class Eager:
    """The static-cache steps run as they are (caches in eager mode: written with
    index_copy_, attended whole with a mask, as a static cache is)."""

    def __init__(self, model, batch: int, cache: int):
        self.g = Generator(adapt(model, batch, cache), cache)
        set_mode(self.g, "eager")
        self.prefill_step, self.decode_step = PrefillStep(self.g), DecodeStep(self.g)

    @torch.no_grad()
    def prefill(self, ids):
        return self.prefill_step(ids)

    @torch.no_grad()
    def decode(self, ids):
        return self.decode_step(ids)

    def reset(self):
        reset_state(self.g)

    @torch.no_grad()
    def greedy(self, ids, n: int):
        token = self.prefill(ids).argmax(-1, keepdim=True)
        yield token
        for _ in range(n - 1):
            token = self.pick(token)
            yield token

    def pick(self, ids):
        return self.decode_step(ids).argmax(-1, keepdim=True)


class Compiled(Eager):
    """The same steps under torch.compile(mode="reduce-overhead") (CUDA graphs on a GPU)."""

    def __init__(self, model, batch: int, cache: int):
        super().__init__(copy.deepcopy(model), batch, cache)
        mode = "reduce-overhead" if next(model.parameters()).is_cuda else None
        step = self.decode_step
        self.prefill_step = torch.compile(self.prefill_step, mode=mode, dynamic=True)
        self.decode_step = torch.compile(step, mode=mode, fullgraph=True)
        self.pick_step = torch.compile(lambda ids: step(ids).argmax(-1, keepdim=True),
                                       mode=mode, fullgraph=True)

    @torch.no_grad()
    def decode(self, ids):
        out = self.decode_step(ids)
        return out.clone()    # a graph's output is overwritten by its next replay

    def pick(self, ids):
        return self.pick_step(ids).clone()


class Loaded:
    """A loaded generator artifact (`self.m`), driven through its module."""
    m = None

    def prefill(self, ids):
        return self.m.prefill(ids)

    def decode(self, ids):
        return self.m.decode(ids)

    def reset(self):
        self.m.reset()

    def greedy(self, ids, n: int):
        return self.m.stream(ids, n)


class Aotc(Loaded):
    """A generator artifact exported from the model, loaded, driven through its module."""

    def __init__(self, model, batch: int, cache: int, prompt, path, target=None,
                 autotune: bool = False, **options):
        """`options`: more export options (benchmarks/quant.py passes quantize="int8")."""
        t = time.perf_counter()
        aotc.export(model, (prompt,), path, decode=True, max_cache_len=cache, autotune=autotune,
                    **({"target": target} if target else
                       {"target": "cuda" if prompt.is_cuda else "cpu"}), **options)
        export_s = time.perf_counter() - t
        t = time.perf_counter()
        self.m = aotc.load(path)
        load_s = time.perf_counter() - t
        self.m.prefill(prompt)
        if prompt.is_cuda:
            torch.cuda.synchronize()
        self.cold = {"export_s": export_s, "load_s": load_s,
                     "load_first_token_s": time.perf_counter() - t,
                     "decode_launches": decode_launches(path)}


def decode_launches(path) -> dict:
    """The steps of an artifact's decode plan that launch work: generated and hand-written
    kernels, and extern (ATen) calls, each a launch or more a step."""
    from aotc.artifact.reader import Artifact
    kinds = [s.kind.value for s in Artifact(path).plan("decode").steps]
    return {"kernels": kinds.count("kernel"), "externs": kinds.count("extern")}
