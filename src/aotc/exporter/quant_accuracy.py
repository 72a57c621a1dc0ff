"""The accuracy of `--quantize`, measured at export: the quantized model against the
unquantized one on the example inputs, both run eagerly (the artifact matches the quantized
model's eager outputs within codegen's rounding, which `--prove` and `aotc verify` check).

    plain models:  relative L2 error over all floating outputs, in float64
    generators:    the same over the prompt's logits, and how many greedy tokens agree, step by
                   step, over the tokens generated after the recorded prompt (16 or fewer)
"""
from __future__ import annotations

import torch

from aotc.exporter.outputs import follow, tree_spec

NEW_TOKENS = 16


def run(model, args: tuple, options) -> dict:
    """What the comparison needs of one model: {"outputs": [floating tensors]} and, for
    generators, {"tokens": greedy tokens generated after the prompt}."""
    with torch.no_grad():
        if options.decode:
            return _generate(model, args[0], options)
        out = model(*args)
        _, paths = tree_spec(out)
        leaves = [follow(out, p) for p in paths]
    return {"outputs": [t.detach() for t in leaves if t.is_floating_point()]}


def _generate(model, ids: torch.Tensor, options) -> dict:
    from aotc.exporter.generate import DecodeStep, Generator, PrefillStep, adapt, reset_state
    from aotc.nn import set_mode
    max_len = options.max_cache_len
    g = Generator(adapt(model, ids.shape[0], max_len), max_len)
    try:
        set_mode(g, "eager")
        reset_state(g)
        logits = PrefillStep(g)(ids)
        first, tokens = logits.clone(), []
        for _ in range(min(NEW_TOKENS, max_len - ids.shape[1] - 1)):
            token = logits.argmax(-1, keepdim=True)
            tokens.append(token)
            logits = DecodeStep(g)(token)
        reset_state(g)
    finally:
        if hasattr(g.decoder, "release"):
            g.decoder.release()
    return {"outputs": [first], "tokens": torch.cat(tokens, dim=1) if tokens else None}


def compare(full: dict, quant: dict) -> dict:
    """The manifest's quantization.accuracy: rel_l2 (None without floating outputs) and, for
    generators, tokens_agree of tokens (greedy tokens equal at the same step)."""
    num = den = 0.0
    for a, b in zip(full["outputs"], quant["outputs"]):
        a, b = a.double(), b.double()
        num += float((a - b).pow(2).sum())
        den += float(a.pow(2).sum())
    out = {"rel_l2": (num / den) ** 0.5 if den > 0 else None,
           "measured_on": "the example inputs, eager, against the unquantized model"}
    if full.get("tokens") is not None:
        same = full["tokens"] == quant["tokens"]
        out["tokens"] = int(same.numel())
        out["tokens_agree"] = int(same.sum())
        steps = same.all(dim=0).tolist()      # steps where every sequence agrees
        out["first_disagreement"] = steps.index(False) if False in steps else None
    return out
