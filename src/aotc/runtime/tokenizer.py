"""The tokenizer an artifact carries (runtime): text in, token ids out, and back.

An artifact exported from a Hugging Face model folder holds the folder's tokenizer files under
`tokenizer/` (artifact/format.py TOKENIZER_FILES), listed and hashed in the manifest like every
file, so a signature covers them. They are read here from the verified bytes, checked as any
artifact data (size limits; JSON parsed by the schema's bounded parser, errors typed as
ArtifactError naming the file), and served by well-kept libraries: `tokenizers` for encoding
and decoding, jinja2's sandbox for the chat template, as transformers renders it. Nothing here
imports transformers.

    tok = Tokenizer.load("model.aotc/tokenizer")     # or m.tokenizer of a loaded artifact
    ids = tok.encode("Hello"); text = tok.decode(ids)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
"""
from __future__ import annotations

from pathlib import Path

from aotc.errors import ArtifactError, UsageError
from aotc.artifact import format as fmt
from aotc.artifact.schema.fields import load_json

FIX = "re-export the model from its folder with this aotc (the tokenizer files are damaged)"


def check_files(files: dict[str, bytes], where: str) -> dict:
    """The tokenizer files (name -> bytes, names of fmt.TOKENIZER_FILES) checked: sizes within
    their limits, the configs parsed by the artifact's bounded JSON parser (name -> value), the
    chat template and tokenizer.json as text (tokenizer.json is parsed by the tokenizers
    library, whose errors `Tokenizer` types)."""
    if fmt.TOKENIZER_JSON not in files:
        raise ArtifactError(f"the tokenizer has no {fmt.TOKENIZER_JSON}", where=where,
                            expected=f"{fmt.TOKENIZER_JSON} beside the other tokenizer files",
                            found=sorted(files), fix="save the tokenizer with a fast "
                            "(tokenizers) backend: tokenizer.save_pretrained(DIR)")
    parsed = {}
    for name, data in files.items():
        limit = fmt.TOKENIZER_FILES.get(name)
        if limit is None or len(data) > limit:
            raise ArtifactError(f"tokenizer file {name} is not one aotc reads, or too large",
                                where=f"{where}/{name}", expected=f"one of "
                                f"{sorted(fmt.TOKENIZER_FILES)} within its size limit",
                                found=f"{len(data)} bytes", fix=FIX)
        if name.endswith(".json") and name != fmt.TOKENIZER_JSON:
            parsed[name] = load_json(bytes(data), f"{where}/{name}").value
        else:
            parsed[name] = _text(data, f"{where}/{name}")
    return parsed


def _text(data: bytes, where: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{where} is not UTF-8 text", where=where, expected="UTF-8",
                            found=str(e)[:120], fix=FIX) from None


def read_folder(folder) -> dict[str, bytes]:
    """The tokenizer files present in `folder` (a model folder or an artifact's tokenizer/),
    by name: regular files only, each within its size limit."""
    out = {}
    for name, limit in fmt.TOKENIZER_FILES.items():
        p = Path(folder) / name
        if p.is_symlink() or not p.is_file():
            continue
        if p.stat().st_size > limit:
            raise ArtifactError(f"tokenizer file {p} is larger than aotc reads", where=str(p),
                                expected=f"at most {limit} bytes",
                                found=f"{p.stat().st_size} bytes", fix=FIX)
        out[name] = p.read_bytes()
    return out


def carried(artifact) -> "Tokenizer | None":
    """The tokenizer an open Artifact carries under tokenizer/ (from its verified bytes), or
    None."""
    prefix = fmt.TOKENIZER_DIR + "/"
    files = {rel[len(prefix):]: artifact.read(rel) for rel in artifact.manifest.files
             if rel.startswith(prefix)}
    return Tokenizer.from_files(files, artifact.where(fmt.TOKENIZER_DIR)) if files else None


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A fast tokenizer, its special tokens, generation config and chat template."""

    def __init__(self, parsed: dict, where: str):
        from tokenizers import Tokenizer as Fast
        self.where = where
        try:
            self.backend = Fast.from_str(parsed[fmt.TOKENIZER_JSON])
        except Exception as e:     # the library's own error for a malformed tokenizer
            raise ArtifactError(f"{fmt.TOKENIZER_JSON} is not a tokenizer the tokenizers "
                                "library reads", where=f"{where}/{fmt.TOKENIZER_JSON}",
                                expected="a tokenizers JSON document",
                                found=f"{type(e).__name__}: {str(e)[:200]}", fix=FIX) from None
        config = parsed.get("tokenizer_config.json") or {}
        special = parsed.get("special_tokens_map.json") or {}
        self.config = config if isinstance(config, dict) else {}
        self.special = {k: _token_text(self.config.get(k, special.get(k) if isinstance(
            special, dict) else None)) for k in ("bos_token", "eos_token", "unk_token",
                                                  "pad_token")}
        gen = parsed.get("generation_config.json")
        self.generation_config = gen if isinstance(gen, dict) else {}
        self.eos_token_ids = self._eos_ids()
        pad = self._id(self.special["pad_token"])
        gen_pad = self.generation_config.get("pad_token_id")
        self.pad_token_id = pad if pad is not None else (
            gen_pad if type(gen_pad) is int else None)
        self.chat_template = self._template(parsed)
        self.files = tuple(sorted(parsed))

    def describe(self) -> str:
        """One line for `aotc inspect`."""
        return (f"{', '.join(self.files)}; vocabulary {self.backend.get_vocab_size()}, eos ids "
                f"{list(self.eos_token_ids)}, pad id {self.pad_token_id}, chat template "
                f"{'yes' if self.chat_template else 'no'}")

    @classmethod
    def load(cls, folder) -> "Tokenizer":
        """The tokenizer in `folder`: an artifact's tokenizer/ folder (or a model folder)."""
        return cls.from_files(read_folder(folder), str(folder))

    @classmethod
    def from_files(cls, files: dict[str, bytes], where: str = fmt.TOKENIZER_DIR) -> "Tokenizer":
        return cls(check_files(files, where), where)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def _eos_ids(self) -> tuple[int, ...]:
        """generation_config.json's eos_token_id (an int or a list), else the tokenizer's eos."""
        eos = self.generation_config.get("eos_token_id")
        ids = [eos] if type(eos) is int else eos if isinstance(eos, list) else []
        if ids and all(type(i) is int and 0 <= i < (1 << 31) for i in ids):
            return tuple(dict.fromkeys(ids))
        own = self._id(self.special["eos_token"])
        return () if own is None else (own,)

    def _template(self, parsed: dict) -> str | None:
        """The chat template: chat_template.jinja, chat_template.json's, or tokenizer_config's
        (a string, or named templates of which "default" is used)."""
        if "chat_template.jinja" in parsed:
            return parsed["chat_template.jinja"]
        doc = parsed.get("chat_template.json")
        value = doc.get("chat_template") if isinstance(doc, dict) else \
            self.config.get("chat_template")
        if isinstance(value, list):
            value = next((t.get("template") for t in value if isinstance(t, dict)
                          and t.get("name") == "default"), None)
        return value if isinstance(value, str) else None

    # ------------------------------------------------------------------------------- text
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise UsageError("encode takes a string", where="Tokenizer.encode",
                             expected="str", found=type(text).__name__,
                             fix="pass the text; a list of texts is encoded one by one")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The conversation as the model's chat template writes it (jinja2's sandbox, with the
        globals and filters transformers gives templates)."""
        if self.chat_template is None:
            raise UsageError("this tokenizer has no chat template", where=self.where,
                             expected="chat_template.jinja or a chat_template in "
                                      "tokenizer_config.json", found="none",
                             fix="use generate() with a prompt, or export a model folder "
                                 "whose tokenizer has a chat template")
        from aotc.runtime.chat import render
        return render(self.chat_template, messages, add_generation_prompt,
                      {k: v or "" for k, v in self.special.items()}, self.where)
