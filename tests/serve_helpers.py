"""Helpers for the server's tests: a word-level tokenizer trained on the fly (the interface of
aotc.runtime.tokenizer.Tokenizer), and waiting for a condition."""
from __future__ import annotations

import time

import jinja2
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, trainers

WORDS = [f"w{i}" for i in range(93)]
TEMPLATE = ("{% for m in messages %}<s> {{ m.role }} {{ m.content }} </s> {% endfor %}"
            "{% if add_generation_prompt %}<s> assistant{% endif %}")


class WordTokenizer:
    """96 tokens: <unk> <s> </s> and the words w0..w92 (ids 3..95), words split on spaces."""

    def __init__(self):
        tok = HFTokenizer(models.WordLevel(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.WordLevelTrainer(vocab_size=96,
                                            special_tokens=["<unk>", "<s>", "</s>"])
        tok.train_from_iterator([" ".join(WORDS)] * 3, trainer)
        assert tok.get_vocab_size() == 96
        self.tok = tok
        self.eos_token_ids = (2,)
        self.pad_token_id = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        return [1, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True
                            ) -> str:
        return jinja2.Template(TEMPLATE).render(messages=messages,
                                                add_generation_prompt=add_generation_prompt)


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out waiting"
        time.sleep(0.01)
