"""transformers decoder families for generation (`decode=True`), small configs with seeded random
weights: what `tests/test_generate_families.py` and `python -m benchmarks.generate_zoo` export
and hold to transformers' own greedy `generate` with a static cache.

`FAMILIES[name] = (model class, config class, config, expected)`: `expected` is "match" for the
decoders aotc serves, or the start of the ExportError / LoweringError message it gives for the
ones it does not. Sliding windows of 8 are shorter than the prompts plus the tokens generated,
so they matter.
"""
from __future__ import annotations

import torch

SMALL = dict(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
MHA = dict(SMALL, num_key_value_heads=4)
GPT = dict(vocab_size=500, n_embd=64, n_layer=2, n_head=4, n_positions=256)
MLA = dict(SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
           qk_nope_head_dim=16, v_head_dim=16, head_dim=8, moe_intermediate_size=32,
           n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
           first_k_dense_replace=1, n_group=1, topk_group=1)
MATCH = "match"

FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", SMALL, MATCH),
    "llama3_rope": ("LlamaForCausalLM", "LlamaConfig", dict(SMALL, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64)), MATCH),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", SMALL, MATCH),
    "qwen2_window": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        SMALL, use_sliding_window=True, sliding_window=8, max_window_layers=1), MATCH),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(SMALL, head_dim=16), MATCH),
    "mistral_window": ("MistralForCausalLM", "MistralConfig", dict(SMALL, sliding_window=8),
                       MATCH),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(SMALL, num_key_value_heads=1,
                                                      head_dim=16), MATCH),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(SMALL, head_dim=16, sliding_window=8),
               MATCH),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(SMALL, head_dim=16,
                                                             sliding_window=8), MATCH),
    "phi": ("PhiForCausalLM", "PhiConfig", MHA, MATCH),
    "phi3_window": ("Phi3ForCausalLM", "Phi3Config", dict(SMALL, pad_token_id=0,
                                                          sliding_window=8), MATCH),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", GPT, MATCH),
    "gptj": ("GPTJForCausalLM", "GPTJConfig", dict(GPT, rotary_dim=8), MATCH),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", MHA, MATCH),
    "gpt_bigcode": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", GPT, MATCH),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
        word_embed_proj_dim=64, max_position_embeddings=256), MATCH),
    "falcon": ("FalconForCausalLM", "FalconConfig", dict(
        vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4), MATCH),
    "stablelm": ("StableLmForCausalLM", "StableLmConfig", SMALL, MATCH),
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", dict(SMALL, sliding_window=8),
                   MATCH),
    "olmo": ("OlmoForCausalLM", "OlmoConfig", SMALL, MATCH),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", SMALL, MATCH),
    "cohere": ("CohereForCausalLM", "CohereConfig", SMALL, MATCH),
    "granite": ("GraniteForCausalLM", "GraniteConfig", SMALL, MATCH),
    "nemotron": ("NemotronForCausalLM", "NemotronConfig", SMALL, MATCH),
    "persimmon": ("PersimmonForCausalLM", "PersimmonConfig", MHA, MATCH),
    # mixtures of experts: transformers' grouped expert product, decomposed by export
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(
        SMALL, num_local_experts=4, num_experts_per_tok=2), MATCH),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64), MATCH),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
        MATCH),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(SMALL, num_experts=4,
                                                      num_experts_per_tok=2), MATCH),
    "granitemoe": ("GraniteMoeForCausalLM", "GraniteMoeConfig", dict(
        SMALL, num_local_experts=4, num_experts_per_tok=2), MATCH),
    "phimoe": ("PhimoeForCausalLM", "PhimoeConfig", dict(
        SMALL, num_local_experts=4, num_experts_per_tok=2, sliding_window=None), MATCH),
    # attention sinks, sliding windows, experts with biases and a clamped gate
    "gpt_oss": ("GptOssForCausalLM", "GptOssConfig", dict(
        SMALL, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
        MATCH),
    # multi-head latent attention: keys of 24 (16 + 8 rotary), values of 16; DeepSeek-V2's
    # rotary embedding computes with complex numbers (exporter/complex.py), Llama 4's too
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", MLA, MATCH),
    "deepseek_v2": ("DeepseekV2ForCausalLM", "DeepseekV2Config", MLA, MATCH),
    "minicpm3": ("MiniCPM3ForCausalLM", "MiniCPM3Config", MLA, MATCH),
    "llama4": ("Llama4ForCausalLM", "Llama4TextConfig", dict(
        SMALL, head_dim=16, num_local_experts=4, intermediate_size_mlp=128), MATCH),
    # chunked attention (chunks of 8: ring caches of 8 slots), its NoPE layer full
    "llama4_chunked": ("Llama4ForCausalLM", "Llama4TextConfig", dict(
        SMALL, num_hidden_layers=4, head_dim=16, num_local_experts=4, intermediate_size_mlp=128,
        attention_chunk_size=8), MATCH),
    # differential attention: nn.RMSNorm without a weight (torch leaves an in-place add)
    "diffllama": ("DiffLlamaForCausalLM", "DiffLlamaConfig", SMALL, MATCH),
    # head sizes that are not powers of two (80: Phi-2's; the CUDA kernels pad them)
    "phi_head80": ("PhiForCausalLM", "PhiConfig", dict(MHA, hidden_size=160, num_attention_heads=2,
                                                        num_key_value_heads=2), MATCH),
    # refused, and why
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(vocab_size=500, hidden_size=64, n_layer=2,
                                                      n_head=4),
              "BloomForCausalLM's attention does not run through transformers' attention"),
    "mpt": ("MptForCausalLM", "MptConfig", dict(vocab_size=500, d_model=64, n_layers=2,
                                                n_heads=4, max_seq_len=256),
            "MptForCausalLM does not run with aotc's attention and cache"),
    "gpt_neo": ("GPTNeoForCausalLM", "GPTNeoConfig", dict(
        vocab_size=500, hidden_size=64, num_layers=2, num_heads=4, window_size=8,
        attention_types=[[["global", "local"], 1]], max_position_embeddings=256),
        "GPTNeoForCausalLM's attention does not run through transformers' attention"),
    "llama_window": ("LlamaForCausalLM", "LlamaConfig", dict(SMALL, sliding_window=8),
                     "layer 0 attends a sliding window of 8 tokens"),
    "deepseek_v32": ("DeepseekV32ForCausalLM", "DeepseekV32Config", MLA,
                     "layers [0, 1] attend as indexed_attention"),
}


def build(name: str) -> torch.nn.Module:
    """FAMILIES[name]'s model, seeded, in eval mode, its generation config free of EOS."""
    import transformers as tf
    model, config, kwargs, _ = FAMILIES[name]
    torch.manual_seed(0)
    m = getattr(tf, model)(getattr(tf, config)(**kwargs)).eval()
    m.generation_config.eos_token_id = None
    return m


def reference(m, ids: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' greedy tokens with a static cache: [batch, prompt + n]."""
    with torch.no_grad():
        return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                          do_sample=False, cache_implementation="static", pad_token_id=0)
