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


def build_model(name: str, device: torch.device, dtype: torch.dtype):
    """(model in eval mode on `device`, meta: vocab, params, weight bytes, KV bytes a token)."""
    if name.startswith("llama-"):
        net = _sample_module()
        size = name.removeprefix("llama-")
        model = _materialize(lambda: net.Net(size=size), device, dtype)
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
        raise SystemExit(f"unknown model {name!r}: llama-small, llama-1b, llama-7b, gpt2")
    model.eval()
    stored = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    item = torch.empty((), dtype=dtype).element_size()
    return model, {"vocab": vocab, "params": sum(p.numel() for p in model.parameters()),
                   "weight_bytes": sum(stored.values()),
                   "kv_bytes_per_token": 2 * layers * kv * head * item}
