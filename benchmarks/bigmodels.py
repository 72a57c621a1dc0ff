"""Models of real size for the loading benchmark, built without ever holding fp32 weights.

    bert      BERT-base (110M parameters; 438 MB in fp32), transformers' BertModel
    llama-1b  a LLaMA-architecture decoder of TinyLlama-1.1B's shape (hidden 2048, 22 layers,
              GQA 32/4 heads, SwiGLU 5632), LlamaForCausalLM
    llama-7b  Llama-2-7B's shape (hidden 4096, 32 layers, 32 heads, SwiGLU 11008; 6.7B
              parameters, 13.5 GB in bf16), LlamaForCausalLM

Parameters are registered on the meta device while the model is built (each is made, in the
target dtype, and moved to meta at once, so at most one exists for real), then materialised
one by one on the target device in the target dtype with seeded random values (norm weights
ones). Buffers (rotary frequencies) are built for real, as the model computes them. Nothing is
downloaded.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

CONFIGS = {
    "bert": ("BertModel", "BertConfig", {}),
    "llama-1b": ("LlamaForCausalLM", "LlamaConfig",
                 dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                      max_position_embeddings=2048, use_cache=False)),
    "llama-7b": ("LlamaForCausalLM", "LlamaConfig",
                 dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      max_position_embeddings=4096, use_cache=False)),
}
SEQ = {"cpu": 32, "cuda": 128}    # a prompt's length; the CPU's first calls stay seconds


@contextlib.contextmanager
def params_on_meta(dtype: torch.dtype):
    """While building: floating tensors default to `dtype` and every parameter goes to meta."""
    register = nn.Module.register_parameter

    def on_meta(self, name, param):
        register(self, name, param)
        if param is not None and not param.is_meta:
            self._parameters[name] = nn.Parameter(param.to("meta"),
                                                  requires_grad=param.requires_grad)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register
        torch.set_default_dtype(old)


def materialise(model: nn.Module, device: torch.device, seed: int = 0) -> nn.Module:
    """Every meta parameter made real on `device`, one at a time; tied ones stay tied."""
    gen = torch.Generator(device=device).manual_seed(seed)
    made: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or not p.is_meta:
                continue
            if id(p) not in made:
                t = torch.empty(p.shape, dtype=p.dtype, device=device)
                if p.dim() == 1 and "norm" in type(mod).__name__.lower():
                    t.fill_(1.0)
                else:
                    t.normal_(0.0, 0.02, generator=gen)
                made[id(p)] = nn.Parameter(t, requires_grad=False)
            mod._parameters[name] = made[id(p)]
    return model.to(device)


def build(name: str, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, tuple]:
    """(model in eval mode on `device` in `dtype`, example inputs: one sequence of SEQ ids)."""
    import transformers
    transformers.logging.set_verbosity_error()
    model_cls, config_cls, kwargs = CONFIGS[name]
    config = getattr(transformers, config_cls)(**kwargs)
    with params_on_meta(dtype):
        model = getattr(transformers, model_cls)(config)
    model = materialise(model, device).eval()
    ids = torch.randint(0, config.vocab_size, (1, SEQ[device.type]),
                        generator=torch.Generator().manual_seed(0)).to(device)
    return model, (ids,)


def weight_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total
