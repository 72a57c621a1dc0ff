"""`aotc generate`: generation on random token ids, timed (tokens/s, prefill latency); or,
with --prompt, the text generated after a prompt.

Each run resets the cache, prefills the prompt, then decodes one token per sequence per step
through the module's `stream` (greedy, or with a sampling Choice a token drawn from the logits,
each run from the same seed); medians over the runs after the first. The first run
also gives the cold numbers: load, and load plus the first token.
"""
from __future__ import annotations

import statistics
import time

import torch

from aotc.runtime.sampling import GREEDY


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_generation(m, prompt: torch.Tensor, new_tokens: int, pick=GREEDY,
                     seed: int = 0) -> dict:
    """One generation through the module's own loop (`m.stream`: on a GPU, greedy steps replay
    the fused greedy graph): (prefill seconds, to the first token; decode seconds for
    new_tokens - 1 steps; tokens)."""
    m.reset()
    gen = torch.Generator(m.device).manual_seed(seed)
    _sync(m.device)
    t0 = time.perf_counter()
    steps = m.stream(prompt, new_tokens, do_sample=pick.sample, temperature=pick.temperature,
                     top_k=pick.top_k, top_p=pick.top_p, min_p=pick.min_p,
                     repetition_penalty=pick.repetition_penalty, generator=gen)
    tokens = [next(steps)]
    _sync(m.device)
    t1 = time.perf_counter()
    tokens.extend(steps)
    _sync(m.device)
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens": torch.cat(tokens, dim=1)}


def generate_report(load, path, *, prompt_len: int, new_tokens: int, runs: int, seed: int,
                    device=None, trusted_keys=None, sampling=None) -> str:
    t0 = time.perf_counter()
    m = load(path, device=device, trusted_keys=trusted_keys)
    load_s = time.perf_counter() - t0
    g = m.generation
    from aotc.errors import UsageError
    if prompt_len < 1 or prompt_len + new_tokens > g.max_cache_len or new_tokens < 2:
        raise UsageError("the prompt and the new tokens do not fit the cache",
                         where="--prompt-len/--new-tokens",
                         expected=f"prompt >= 1, new tokens >= 2, together <= "
                                  f"{g.max_cache_len}",
                         found=f"{prompt_len} + {new_tokens}",
                         fix="generate fewer tokens or use a shorter prompt")
    lo, hi = m.inputs[0].values or (0, g.vocab - 1)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(lo, hi + 1, (g.batch, prompt_len), generator=gen).to(m.device)
    pick = sampling or GREEDY
    first = timed_generation(m, prompt, new_tokens, pick, seed)
    cold_first_token = load_s + first["prefill_s"]
    timed = [timed_generation(m, prompt, new_tokens, pick, seed) for _ in range(max(1, runs))]
    prefill = statistics.median(r["prefill_s"] for r in timed)
    decode = statistics.median(r["decode_s"] for r in timed)
    steps = (new_tokens - 1) * g.batch
    same = all(torch.equal(r["tokens"], first["tokens"]) for r in timed)
    return "\n".join([
        f"{m.signature()}  (cache {g.max_cache_len} tokens, batch {g.batch})",
        f"generated {new_tokens} tokens after a {prompt_len}-token prompt, "
        + pick.describe()
        + ("" if same else " (runs differ!)"),
        f"first tokens: {first['tokens'][0, :12].tolist()}",
        f"load {load_s * 1e3:.1f} ms, load + first token {cold_first_token * 1e3:.1f} ms",
        f"prefill {prefill * 1e3:.2f} ms (median of {len(timed)})",
        f"decode {steps / decode:.1f} tokens/s ({decode / (new_tokens - 1) * 1e3:.3f} ms a "
        f"step, {g.batch} sequence{'s' if g.batch > 1 else ''})"])


def prompt_text(m, prompt: str, new_tokens: int, seed: int, sampled: dict) -> str:
    """`aotc generate --prompt`: the text generated after `prompt` (greedy, or sampled from
    `seed` with the `sampled` settings)."""
    kwargs = {}
    if sampled:
        kwargs = dict(sampled, do_sample=True,
                      generator=torch.Generator(m.device).manual_seed(seed))
    return m.generate(prompt, max_new_tokens=new_tokens, **kwargs)
