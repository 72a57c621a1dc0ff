"""Greedy tokens of CUDA generator artifacts against transformers' own `generate` with a static
cache, in bf16 on a GPU (the issue's check: the first 32 tokens equal, for the plain-torch
sample and several transformers families; bf16 ties may flip a later token, so the first
divergence is reported, not only pass/fail).

    python scripts/gpu_generate_check.py --families llama,qwen2,mistral,gpt2,sample --new 32
    python scripts/gpu_generate_check.py --families gemma2,gemma3,mistral_window,mixtral
    python scripts/gpu_generate_check.py --families deepseek_v3,llama4_chunked,phi_head80

Models are mid-size configs with seeded random weights (hidden 512, 4 layers, vocab 32000),
built in bf16 on the device; two prompts of 24 random ids (batch 2). One line per family. For
scale, each line also gives where eager bf16 and aotc bf16 leave the tokens of the same weights
in fp32 on the CPU (random weights give flat logits, so bf16 rounding flips near-ties early).
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
import tempfile
import traceback
import time
from pathlib import Path

import torch

import aotc

ROOT = Path(__file__).resolve().parents[1]


def _transformers(family: str):
    import transformers as tf
    common = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)
    make = {"llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**common)),
            "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**common)),
            "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(sliding_window=None,
                                                                      **common)),
            "gemma": lambda: tf.GemmaForCausalLM(tf.GemmaConfig(head_dim=64, **common)),
            # sliding windows shorter than prompt + new tokens, soft-capped scores, experts
            "gemma2": lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(head_dim=64,
                                                                   sliding_window=16, **common)),
            "gemma3": lambda: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(
                head_dim=64, sliding_window=16, **common)),
            "mistral_window": lambda: tf.MistralForCausalLM(tf.MistralConfig(
                sliding_window=16, **common)),
            "mixtral": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(
                num_local_experts=8, num_experts_per_tok=2, **common)),
            "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=512, n_layer=4, n_head=8,
                                                             n_positions=1024)),
            # latent attention: keys of 96 (64 + 32 rotary, not a power of two), values of 64
            "deepseek_v3": lambda: tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**dict(
                common, num_key_value_heads=8, kv_lora_rank=128, q_lora_rank=256,
                qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, head_dim=32,
                moe_intermediate_size=256, n_routed_experts=8, num_experts_per_tok=2,
                n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1))),
            # chunked attention, chunks of 16 (ring caches), complex rotary embeddings
            "llama4_chunked": lambda: tf.Llama4ForCausalLM(tf.Llama4TextConfig(**dict(
                common, head_dim=64, num_local_experts=4, intermediate_size_mlp=1408,
                attention_chunk_size=16))),
            # heads of 80 (Phi-2's), padded in the decode kernels' registers
            "phi_head80": lambda: tf.PhiForCausalLM(tf.PhiConfig(**dict(
                common, hidden_size=640, num_key_value_heads=8)))}
    return make[family]()


def _sample():
    spec = importlib.util.spec_from_file_location("aotc_check_llama", ROOT / "samples/llama.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Net(layers=4, dim=512, heads=8, kv_heads=4, hidden=1408, vocab=32000)


def _reference(family: str, model, ids, n: int, cache: int, compile_ok=True) -> torch.Tensor:
    """The tokens of transformers' `generate` (on a GPU it compiles the forward of a static
    cache itself unless `compile_ok` is False), or of the sample's eager steps."""
    with torch.no_grad():
        if family == "sample":
            from aotc.exporter.generate import Generator, adapt, eager_generate
            return eager_generate(Generator(adapt(model, ids.shape[0], cache), cache), ids, n)
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                              do_sample=False, cache_implementation="static", pad_token_id=0,
                              disable_compile=not compile_ok)


def check(family: str, n: int, cache: int, out_dir: Path, device: str) -> str:
    torch.manual_seed(0)
    model = (_sample() if family == "sample" else _transformers(family)).eval()
    if family != "sample":
        model.generation_config.eos_token_id = None
    tables = (model.cos, model.sin) if family == "sample" else None
    model = model.to(device, torch.bfloat16)
    if tables:                      # the rotary tables stay float32, as the sample makes them
        model.cos, model.sin = (t.to(device) for t in tables)
    ids = torch.randint(1, 32000, (2, 24), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    want = _reference(family, model, ids, n, cache).cpu()
    eager = _reference(family, model, ids, n, cache, compile_ok=False).cpu()
    exact = _reference(family, copy.deepcopy(model).float().cpu(), ids.cpu(), n, cache)
    t = time.perf_counter()
    path = aotc.export(model, (ids,), out_dir / f"{family}.aotc", decode=True,
                       max_cache_len=cache,
                       target="cuda:sm_90" if device == "cuda" else "cpu")
    export_s = time.perf_counter() - t
    got = aotc.load(path).generate(ids, n)
    first = _divergence(got.cpu(), want, ids.shape[1])
    verdict = "ok" if first is None else ("FAIL" if first < 32 else "ok (late flip)")
    prompt = ids.shape[1]
    return (f"{family:8s} {verdict:15s} first divergence from generate bf16: {_at(first)}; "
            f"from eager bf16: {_at(_divergence(got.cpu(), eager, prompt))}; from fp32 on the "
            f"CPU: generate bf16 {_at(_divergence(want, exact, prompt))}, eager bf16 "
            f"{_at(_divergence(eager, exact, prompt))}, aotc bf16 "
            f"{_at(_divergence(got.cpu(), exact, prompt))}; of {n}; export {export_s:.1f} s")


def _divergence(a: torch.Tensor, b: torch.Tensor, prompt: int) -> int | None:
    """The first generated position where any row of `a` and `b` differ, else None."""
    diff = (a[:, prompt:] != b[:, prompt:]).any(0).nonzero()
    return int(diff[0]) if len(diff) else None


def _at(first: int | None) -> str:
    return "none" if first is None else f"token {first}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="sample,llama,qwen2,mistral,gpt2")
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--cache", type=int, default=128)
    p.add_argument("--device", default="cuda", help="cuda (the check), or cpu (a smoke run)")
    args = p.parse_args()
    print(torch.__version__, args.device, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            try:
                print(check(family, args.new, args.cache, Path(tmp), args.device), flush=True)
            except Exception as e:   # one family's failure must not hide the others'
                where = traceback.extract_tb(e.__traceback__)[-3:]
                print(f"{family:8s} ERROR {type(e).__name__}: {str(e)[:400]}\n    at " +
                      " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in where[::-1]),
                      flush=True)


if __name__ == "__main__":
    main()
