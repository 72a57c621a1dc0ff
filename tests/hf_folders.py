"""Hugging Face model folders for tests: tiny models from configs (random weights) saved with a
tokenizer trained on the fly by the `tokenizers` library, wrapped in transformers'
PreTrainedTokenizerFast and `save_pretrained` beside the model. Nothing is downloaded."""
from __future__ import annotations

from pathlib import Path

import torch

WORDS = [f"w{i}" for i in range(300)] + ("the quick brown fox jumps over a lazy dog hello "
                                         "world and then some more words").split()
CORPUS = [" ".join(WORDS[i:i + 12]) for i in range(0, len(WORDS), 3)]
CHAT = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] | trim }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}")


def bpe_tokenizer():
    """A byte-level BPE tokenizer (Llama/GPT-2 style) with <s>, </s>, <pad> and a template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<unk>", "<s>", "</s>", "<pad>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT
    return fast


def wordpiece_tokenizer():
    """A BERT-style WordPiece tokenizer ([CLS] ... [SEP])."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def llama_folder(path: Path) -> Path:
    """A tiny LlamaForCausalLM saved in several safetensors shards, with its tokenizer and a
    generation config whose eos is </s>."""
    import transformers
    tok = bpe_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=3)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, max_shard_size="50KB")
    tok.save_pretrained(path)
    return path


def bert_folder(path: Path, cls: str = "BertForMaskedLM") -> Path:
    import transformers
    tok = wordpiece_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64, num_labels=3)
    getattr(transformers, cls)(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def vit_folder(path: Path) -> Path:
    import transformers
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, image_size=32, patch_size=8, num_labels=4)
    transformers.ViTForImageClassification(cfg).save_pretrained(path)
    return path


def gpt2_folder(path: Path, cls: str = "GPT2LMHeadModel") -> Path:
    """A tiny GPT-2 (learned positions: n_positions bounds the cache) with the BPE tokenizer."""
    import transformers
    tok = bpe_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2,
                                  n_positions=96, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=3, num_labels=3)
    getattr(transformers, cls)(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path
