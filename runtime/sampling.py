"""Choosing the next token from a generator's logits: greedy, or sampled.

`Sampling(temperature, top_k, top_p)` applies what transformers' `generate(do_sample=True)`
applies, in its order, so the same logits and the same random state give the same tokens:
the logits divided by the temperature, all but the `top_k` largest set to -inf, then all but
the smallest set of tokens whose probabilities sum past `top_p` (the most likely always kept),
and one token drawn per sequence from the softmax with `torch.multinomial` (from `generator`,
or torch's global random state). It runs on the logits' device, after the decode step's plan
(a CUDA graph replays the plan alone; the draw reads nothing back to the host).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from aotc.errors import UsageError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 0           # 0: every token
    top_p: float = 1.0       # 1.0: every token

    def __post_init__(self):
        checks = (("temperature", self.temperature, self.temperature > 0, "a number > 0"),
                  ("top_k", self.top_k, isinstance(self.top_k, int) and self.top_k >= 0,
                   "an int >= 0 (0 keeps every token)"),
                  ("top_p", self.top_p, 0 < self.top_p <= 1, "a number in (0, 1]"))
        for name, value, ok, want in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
                raise UsageError(f"sampling's {name} is out of range", where=name,
                                 expected=want, found=repr(value),
                                 fix=f"pass {name} as {want}")

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed logits [batch, vocab] (float32): -inf where a token is ruled out."""
        scores = logits.float()
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if self.top_k:
            kth = torch.topk(scores, min(self.top_k, scores.shape[-1]))[0][..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False)
            drop = ordered.softmax(-1).cumsum(-1) <= 1 - self.top_p
            drop[..., -1:] = False                       # the most likely token stays
            scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        return scores

    def __call__(self, logits: torch.Tensor, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
        """One token per sequence [batch, 1] (int64) drawn from the processed logits."""
        probs = self.scores(logits).softmax(-1)
        return torch.multinomial(probs, 1, generator=generator)


def greedy(logits: torch.Tensor, generator=None) -> torch.Tensor:
    """The most likely token per sequence [batch, 1]."""
    return logits.argmax(-1, keepdim=True)
