"""Embeddings from a feature-extraction artifact (serve stage): what `/v1/embeddings` answers.

In: a loaded encoder artifact whose forward takes `input_ids` [batch, seq] (and an
`attention_mask`) and returns `last_hidden_state` [batch, seq, hidden] (`aotc export DIR --task
feature-extraction`, docs/huggingface.md), with its tokenizer; inputs as OpenAI's API gives
them (a string, a list of strings, a list of token ids, or a list of those). Out: one vector
per input, the mean of its tokens' hidden states (the mask's tokens only) scaled to unit
length, as sentence-transformers' mean pooling gives them, and the prompt token count.
Inputs run in batches of up to `BATCH`, each right-padded to its longest input.
"""
from __future__ import annotations

import base64
import threading

import torch

from aotc.errors import UsageError

BATCH = 32


class Embedder:
    def __init__(self, module, tokenizer):
        if tokenizer is None:
            raise UsageError("an embedding artifact needs its tokenizer", where="aotc serve",
                             expected="an artifact exported from a model folder with its "
                             "tokenizer", found="none", fix="export the model folder with "
                             "--task feature-extraction")
        self.module, self.tokenizer = module, tokenizer
        self.masked = len(module.inputs) >= 2
        self.vocab = tokenizer.backend.get_vocab_size() if hasattr(tokenizer, "backend") \
            else 1 << 62
        self.lock = threading.Lock()

    def tokens(self, item) -> list[int]:
        """One input as token ids (a string through the tokenizer)."""
        if isinstance(item, str):
            return self.tokenizer.encode(item)
        return list(item)

    def embed(self, inputs: list[list[int]]) -> list[torch.Tensor]:
        """Unit-length mean-pooled vectors [hidden] of the inputs (token ids), in order."""
        out = []
        for i in range(0, len(inputs), BATCH):
            group = inputs[i:i + BATCH]
            width = max(map(len, group))
            ids = torch.tensor([p + [0] * (width - len(p)) for p in group], dtype=torch.int64)
            mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in group],
                                dtype=torch.int64)
            dev = self.module.device
            with self.lock:
                res = self.module(ids.to(dev), mask.to(dev)) if self.masked else \
                    self.module(ids.to(dev))
            hidden = res["last_hidden_state"] if isinstance(res, dict) else None
            if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
                raise UsageError("the artifact gives no last_hidden_state", where="embeddings",
                                 expected="a feature-extraction artifact's output "
                                 "(last_hidden_state [batch, seq, hidden])",
                                 found=type(res).__name__, fix="export the model folder with "
                                 "--task feature-extraction")
            weights = mask.to(hidden.device, hidden.dtype).unsqueeze(-1)
            pooled = (hidden * weights).sum(1) / weights.sum(1)
            out += list(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu())
        return out


def encoded(vector: torch.Tensor, encoding: str):
    """A vector as OpenAI's API sends it: floats, or base64 of little-endian float32."""
    if encoding == "base64":
        return base64.b64encode(vector.to(torch.float32).numpy().astype("<f4").tobytes()
                                ).decode()
    return vector.tolist()


def response(vectors: list, tokens: int, model: str, encoding: str) -> dict:
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": encoded(v, encoding)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def checked_inputs(embedder: Embedder, given) -> list[list[int]]:
    """The request's inputs as lists of token ids, or a UsageError saying what is wrong."""
    items = [given] if isinstance(given, str) or (
        isinstance(given, list) and given and all(isinstance(t, int) for t in given)) else given
    if not isinstance(items, list) or not items or len(items) > 2048:
        raise UsageError("input must be a string, a list of strings or token id lists",
                         where="input", expected="1..2048 inputs", found=repr(given)[:80],
                         fix="send the text to embed")
    out = [embedder.tokens(x) if isinstance(x, list) or isinstance(x, str) and x.strip()
           else None for x in items]
    for x in out:
        if not x or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 and
                                            t < embedder.vocab for t in x):
            raise UsageError("an input is empty or holds what is not a token id", where="input",
                             expected="non-empty text or token ids", found=repr(x)[:80],
                             fix="send non-empty strings")
    return out

