"""transformers models built from their configs with random weights (never downloaded).

    aotc export samples/hf_models.py:gpt2 --example-input 2x32:int64:0..999
    aotc export samples/hf_models.py:bert --example-input 2x32:int64:0..999

Sizes default to a small configuration so that export and tests take seconds on a CPU; pass
--init-args '{"full": true}' for the published base sizes (GPT-2 small, BERT-base). The KV cache
is switched off (use_cache=False): a cache object is not a tensor an artifact can return.
"""
from __future__ import annotations


def _small(full: bool, **small):
    return {} if full else small


def gpt2(full: bool = False, vocab: int = 1000):
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(use_cache=False, vocab_size=50257 if full else vocab,
                     **_small(full, n_layer=2, n_embd=128, n_head=4, n_positions=256))
    return GPT2Model(cfg)


def bert(full: bool = False, vocab: int = 1000):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=30522 if full else vocab,
                     **_small(full, num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                              intermediate_size=512, max_position_embeddings=256))
    return BertModel(cfg)
