"""Choosing the next token from a generator's logits: greedy, or sampled.

`Choice` applies what transformers' `generate` applies, in its order, so the same logits and
the same random state give the same tokens: a repetition penalty over the tokens so far (in
greedy choice too: a seen token's logit divided by the penalty where positive, multiplied
where negative); then, when sampling, the logits divided by the temperature, all but the
`top_k` largest set to -inf, all but the smallest set of tokens whose probabilities sum past
`top_p` (the most likely always kept), those less likely than `min_p` times the most likely,
and one token drawn per sequence from the softmax with `torch.multinomial` (from `generator`,
or torch's global random state). It runs on the logits' device, after the decode step's plan
(a CUDA graph replays the plan alone; the draw reads nothing back to the host).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from aotc.errors import UsageError


@dataclass(frozen=True)
class Choice:
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0           # 0: every token
    top_p: float = 1.0       # 1.0: every token
    min_p: float = 0.0       # 0.0: every token
    repetition_penalty: float = 1.0

    def __post_init__(self):
        checks = (("temperature", self.temperature, self.temperature > 0, "a number > 0"),
                  ("top_k", self.top_k, isinstance(self.top_k, int) and self.top_k >= 0,
                   "an int >= 0 (0 keeps every token)"),
                  ("top_p", self.top_p, 0 < self.top_p <= 1, "a number in (0, 1]"),
                  ("min_p", self.min_p, 0 <= self.min_p <= 1, "a number in [0, 1]"),
                  ("repetition_penalty", self.repetition_penalty,
                   self.repetition_penalty > 0, "a number > 0 (1.0: no penalty)"))
        for name, value, ok, want in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
                raise UsageError(f"sampling's {name} is out of range", where=name,
                                 expected=want, found=repr(value),
                                 fix=f"pass {name} as {want}")
        warps = (self.temperature, self.top_k, self.top_p, self.min_p) != (1.0, 0, 1.0, 0.0)
        if warps and not self.sample:
            raise UsageError("temperature, top_k, top_p and min_p apply only to sampling",
                             where="generate", expected="do_sample=True with them",
                             found=f"temperature={self.temperature}, top_k={self.top_k}, "
                                   f"top_p={self.top_p}, min_p={self.min_p} without do_sample",
                             fix="pass do_sample=True, or leave them out for greedy "
                                 "generation")

    def describe(self) -> str:
        """"greedy", or "sampled (...)" with the settings that differ from the defaults."""
        import dataclasses
        changed = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                   if f.name != "sample" and getattr(self, f.name) != f.default]
        what = "sampled" if self.sample else "greedy"
        return f"{what} ({', '.join(changed)})" if changed else what

    @property
    def wants_history(self) -> bool:
        """Whether a choice reads the tokens so far (a repetition penalty does)."""
        return self.repetition_penalty != 1.0

    def scores(self, logits: torch.Tensor, history: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The processed logits [batch, vocab] (float32): -inf where a token is ruled out."""
        scores = logits.float()
        if self.wants_history:
            seen = torch.gather(scores, 1, history)
            seen = torch.where(seen < 0, seen * self.repetition_penalty,
                               seen / self.repetition_penalty)
            scores = scores.scatter(1, history, seen)
        if not self.sample:
            return scores
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
        if self.min_p:
            probs = scores.softmax(-1)
            drop = probs < self.min_p * probs.amax(-1, keepdim=True)
            drop = drop.scatter(-1, probs.argmax(-1, keepdim=True), False)
            scores = scores.masked_fill(drop, float("-inf"))
        return scores

    def __call__(self, logits: torch.Tensor, generator: torch.Generator | None = None,
                 history: torch.Tensor | None = None) -> torch.Tensor:
        """One token per sequence [batch, 1] (int64): the most likely after the penalty, or
        drawn from the processed logits."""
        if not self.sample and not self.wants_history:
            return logits.argmax(-1, keepdim=True)
        scores = self.scores(logits, history)
        if not self.sample:
            return scores.argmax(-1, keepdim=True)
        return torch.multinomial(scores.softmax(-1), 1, generator=generator)


GREEDY = Choice()
