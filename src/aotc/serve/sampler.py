"""The next token of every request in an engine step at once, on the device (serve stage).

In: the step's logits [R, vocab] (one row per request that gets a token: the decode's live
slots, then the prompts whose last chunk was prefilled), the plan's greedy tokens [R, 1], and
each row's sampling. Out: the tokens [R, 1], on the device; the engine reads them back with
one transfer a step.

Greedy rows take the plan's argmax. Sampled rows are drawn in one batch: the logits divided
by the row's temperature, all but its `top_k` most likely set to -inf, then all but the
smallest set of most likely tokens whose probabilities reach its `top_p` (the most likely
always kept), as transformers' warpers do; the token is found by inverse transform sampling:
the first token, most likely first, whose cumulative probability passes the row's uniform
number. That number comes from the request's own `random.Random` (seeded by its `seed`), one
draw per token, so a seeded request draws the same tokens whatever runs beside it, and the
draws read nothing back from the device.
"""
from __future__ import annotations

import random

import torch


class Draws:
    """A request's random numbers: one uniform in [0, 1) per sampled token."""

    def __init__(self, seed: int | None):
        self.rng = random.Random(seed)

    def next(self) -> float:
        return self.rng.random()


def choose(logits: torch.Tensor, greedy: torch.Tensor, rows: list) -> torch.Tensor:
    """The tokens [R, 1] (int64) for `rows`: each a (SamplingParams, Draws or None) pair,
    greedy where its temperature is 0."""
    sampled = [i for i, (p, _) in enumerate(rows) if not p.greedy]
    if not sampled:
        return greedy
    dev = logits.device
    pick = torch.tensor(sampled, dtype=torch.int64, device=dev) if len(sampled) < len(rows) \
        else None
    sub = logits if pick is None else logits.index_select(0, pick)
    params = [rows[i][0] for i in sampled]
    host = torch.tensor([[p.temperature, p.top_p, rows[i][1].next()]
                         for i, p in zip(sampled, params)], dtype=torch.float32)
    ks = torch.tensor([p.top_k or logits.shape[-1] for p in params], dtype=torch.int64)
    host, ks = host.to(dev, non_blocking=True), ks.to(dev, non_blocking=True)
    drawn = sample(sub, host[:, 0:1], ks, host[:, 1:2], host[:, 2:3])
    if pick is None:
        return drawn
    return greedy.clone().index_copy_(0, pick, drawn)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row [R, 1] from logits [R, V], with per-row temperature [R, 1], top_k [R]
    (V: every token), top_p [R, 1] and uniform numbers u [R, 1]."""
    scores = logits.float() / temperature
    ordered, order = scores.sort(dim=-1, descending=True)
    rank = torch.arange(scores.shape[-1], device=scores.device)
    ordered = ordered.masked_fill(rank[None, :] >= top_k[:, None], float("-inf"))
    probs = ordered.softmax(-1)
    before = probs.cumsum(-1) - probs                   # the mass of the likelier tokens
    probs = probs.masked_fill((before >= top_p) & (rank[None, :] > 0), 0.0)
    cum = probs.cumsum(-1)
    at = torch.searchsorted(cum, u * cum[:, -1:], right=True).clamp_(max=scores.shape[-1] - 1)
    return order.gather(1, at)
