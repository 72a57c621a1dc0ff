"""Text generation (runtime): prompts in, text out, through the tokenizer an artifact carries.

    m = aotc.load("llm.aotc")
    m.generate("a prompt", max_new_tokens=64)            # -> str, the text after the prompt
    m.generate(["two", "prompts"], max_new_tokens=64)    # -> [str, str]
    m.chat([{"role": "user", "content": "Hi"}], max_new_tokens=64)   # the chat template's

Prompts are encoded with the artifact's tokenizer (runtime/tokenizer.py), generated with the
module's token-level `stream` (greedy, or sampled with its keyword arguments) and stopped at
the tokenizer's end-of-sequence ids (generation_config.json's); the completion, up to its
first end-of-sequence token, is decoded without special tokens.

A generator's batch is fixed at export. Prompts of one length, as many as the batch, run as
one batch; any other list runs prompt by prompt (`_each_alone`; a batch larger than one runs
a prompt in every row and keeps the first). A generator with slots (`--max-batch N`) runs up
to N prompts of any lengths at once, each in its own slot (left-padded, runtime/slots.py).
"""
from __future__ import annotations

import torch

from aotc.errors import UsageError

CHECK_EVERY = 8     # steps between reads of whether every row has ended (tokens after are cut)


def tokenizer_of(m):
    if m.tokenizer is None:
        raise UsageError(f"{m.path} carries no tokenizer: it generates from token ids",
                         where="generate(text)", expected="an artifact exported from a Hugging "
                         "Face model folder (aotc export DIR --task text-generation)",
                         found="no tokenizer/ in the artifact",
                         fix="pass token ids: m.generate(input_ids_tensor, max_new_tokens=N)")
    return m.tokenizer


def generate_text(m, prompts, max_new_tokens: int, **sampling):
    """`m.generate` for a prompt (-> str) or a list of prompts (-> list of str)."""
    tok = tokenizer_of(m)
    single = isinstance(prompts, str)
    texts = [prompts] if single else list(prompts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise UsageError("generate takes a prompt, a list of prompts or a tensor of token ids",
                         where="generate", expected="str, list[str] or torch.Tensor",
                         found=repr(prompts)[:80], fix="pass text or token ids")
    outs = generate_ids(m, [tok.encode(t) for t in texts], max_new_tokens, **sampling)
    out = [tok.decode(o) for o in outs]
    return out[0] if single else out


def chat(m, messages, max_new_tokens: int, **sampling) -> str:
    tok = tokenizer_of(m)
    ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True),
                     add_special_tokens=False)
    return tok.decode(generate_ids(m, [ids], max_new_tokens, **sampling)[0])


def generate_ids(m, prompts: list[list[int]], max_new_tokens: int, **sampling) -> list:
    """The completion ids of each prompt (cut before its first end-of-sequence token)."""
    for i, p in enumerate(prompts):
        if not p:
            raise UsageError(f"prompt {i} encodes to no tokens", where=f"prompt {i}",
                             expected="at least one token", found="an empty encoding",
                             fix="give a non-empty prompt")
    slots = getattr(m, "slots", 0)
    if slots:         # each prompt in a slot of its own: padded batches of up to `slots`
        return [out for i in range(0, len(prompts), slots)
                for out in _run(m, prompts[i:i + slots], max_new_tokens, sampling)]
    batch = m.generation.batch
    if len(prompts) == batch and len({len(p) for p in prompts}) == 1:
        return _run(m, prompts, max_new_tokens, sampling)
    return _each_alone(m, prompts, max_new_tokens, sampling)


def _each_alone(m, prompts, max_new_tokens, sampling) -> list:
    """Prompts of different lengths, one at a time (each in every row of the batch)."""
    batch = m.generation.batch
    return [_run(m, [p] * batch, max_new_tokens, sampling)[0] for p in prompts]


def _run(m, prompts, max_new_tokens, sampling) -> list:
    """One batch of prompts (of one length, or left-padded with their attention mask for a
    generator with slots): each row's tokens before its first eos id."""
    eos = torch.tensor(m.tokenizer.eos_token_ids, dtype=torch.int64, device=m.device)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], dtype=torch.int64,
                       device=m.device)
    if any(len(p) < width for p in prompts):
        sampling = {**sampling, "attention_mask": torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=m.device)}
    steps, done = [], None
    with m.lock:
        stream = m.stream(ids, max_new_tokens, **sampling)
        try:
            for i, token in enumerate(stream):
                steps.append(token)
                hit = torch.isin(token[:, 0], eos)
                done = hit if done is None else done | hit
                if i % CHECK_EVERY == CHECK_EVERY - 1 and bool(done.all()):   # a device read
                    break
        finally:
            stream.close()
    rows = torch.cat(steps, dim=1).tolist()
    ends = set(m.tokenizer.eos_token_ids)
    return [row[:next((i for i, t in enumerate(row) if t in ends), len(row))] for row in rows]
