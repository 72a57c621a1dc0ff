"""Decoders of the generation benchmark, with seeded random weights, built in the run dtype
on the device (large ones on the meta device first, so the host never holds them in fp32)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "llama.py"


def _sample_module():
    spec = importlib.util.spec_from_file_location("aotc_bench_llama", SAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # Dynamo looks functions' modules up there
    spec.loader.exec_module(module)
    return module


def _materialize(make, device, dtype) -> torch.nn.Module:
    """`make()` built on the meta device, then given seeded random weights in `dtype`."""
    with torch.device("meta"):
        model = make()
    model = model.to_empty(device=device).to(dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 1 / max(p.shape[-1], 1) ** 0.5 if p.dim() >= 2 else 0.0
            init = torch.randn(p.shape, generator=gen) * std if p.dim() >= 2 else \
                torch.ones(p.shape)
            p.copy_(init.to(dtype))
    return model


# Decoder shapes beyond samples/llama.py's sizes: (size, overrides of its config).
SHAPES = {
    # Qwen2-0.5B's shape: thin and deep, GQA 14/2, a large tied vocabulary (no QKV bias here)
    "qwen-0.5b": ("1b", dict(vocab=151936, dim=896, layers=24, heads=14, kv_heads=2,
                             hidden=4864, tied=True)),
    # LLaMA-3.2-1B's shape: width 2048, 16 layers, GQA 32/8, vocabulary 128256 (untied here)
    "llama3-1b": ("1b", dict(vocab=128256, dim=2048, layers=16, heads=32, kv_heads=8,
                             hidden=8192)),
    # CPU-sized stand-ins with the same structure, for checking the scripts without a GPU
    "qwen-tiny": ("small", dict(vocab=1024, dim=128, layers=2, heads=4, kv_heads=2,
                                hidden=256, tied=True)),
    "llama3-tiny": ("small", dict(vocab=1024, dim=128, layers=2, heads=4, kv_heads=2,
                                  hidden=256)),
    # the CPU's decode benchmark (benchmarks/quant.py): 14M parameters, 56 MB in fp32 (past the
    # caches), widths every int4 group size divides (llama-small's 688 is not)
    "llama-cpu": ("small", dict(vocab=4096, dim=512, layers=4, heads=8, kv_heads=2,
                                hidden=1536)),
}


def build_model(name: str, device: torch.device, dtype: torch.dtype):
    """(model in eval mode on `device`, meta: vocab, params, weight bytes, KV bytes a token)."""
    if name.startswith("llama-") or name in SHAPES:
        net = _sample_module()
        size, overrides = SHAPES.get(name, (name.removeprefix("llama-"), {}))
        overrides = dict(overrides)
        tied = overrides.pop("tied", False)
        model = _materialize(lambda: net.Net(size=size, **overrides), device, dtype)
        if tied:   # the output projection is the token embedding (Qwen2's tie_word_embeddings)
            model.output.weight = model.embed.weight
        cos, sin = net.rotary_tables(model.config["dim"] // model.config["heads"], 4096)
        model.cos, model.sin = cos.to(device), sin.to(device)   # buffers, not random
        cfg = model.config
        layers, kv, head = cfg["layers"], cfg["kv_heads"], cfg["dim"] // cfg["heads"]
        vocab = cfg["vocab"]
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_positions=4096)
        model = _materialize(lambda: GPT2LMHeadModel(config), device, dtype)
        model.tie_weights()
        layers, kv, head, vocab = config.n_layer, config.n_head, config.n_embd // config.n_head, \
            config.vocab_size
        model.generation_config.eos_token_id = None
    else:
        raise SystemExit(f"unknown model {name!r}: llama-small, llama-1b, llama-7b, gpt2, "
                         f"{', '.join(SHAPES)}")
    model.eval()
    stored = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    item = torch.empty((), dtype=dtype).element_size()
    return model, {"vocab": vocab, "params": sum(p.numel() for p in model.parameters()),
                   "weight_bytes": sum(stored.values()),
                   "kv_bytes_per_token": 2 * layers * kv * head * item}
