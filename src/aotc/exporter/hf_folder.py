"""Hugging Face model folders (exporter): a folder written by `save_pretrained` and a task in;
the model with its real weights, example inputs, dynamic dims and tokenizer files out.

    aotc export ./tiny-llama --task text-generation -o llm.aotc
    aotc.export("./tiny-bert", path="bert.aotc", task="fill-mask")

The task defaults from `config.architectures` (TASKS: the auto class each task loads and the
class-name endings that name it). The model comes from transformers' auto class
`from_pretrained(folder)`: the folder's safetensors, sharded or not, and no Python file of
its own (`trust_remote_code` stays off). Example inputs follow the task and the config:

    text tasks      input_ids [batch, seq] int64 in [0, vocab) and attention_mask [batch, seq]
                    (ones; values 0..1), batch 1..MAX_BATCH and seq 1..the model's positions
                    dynamic (examples --batch 2, --seq-len 16)
    image tasks     pixel_values [batch, channels, size, size] (--image-size, default the
                    config's), batch 1..MAX_BATCH dynamic
    text-generation a generator (`--decode`, exporter/generate.py): a prompt [batch, seq] of
                    dynamic length, the batch fixed (--batch, default 1), the KV cache no
                    longer than the model's positions; transformers' own cache is replaced
                    by aotc's; other tasks export with `use_cache=False` (no cache object
                    among the outputs)

The tokenizer files (artifact/format.py TOKENIZER_FILES) travel into the artifact's tokenizer/.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from aotc.errors import ExportError, UsageError
from aotc.exporter.capture import quiet
from aotc.artifact import format as fmt

MAX_BATCH = 256          # the batch range of dynamic-batch exports: 1..MAX_BATCH
DEFAULT_SEQ = 16         # example sequence length (text tasks, the generator's prompt)

# task -> (transformers auto class, architecture name endings that mean this task)
TASKS = {
    "text-generation": ("AutoModelForCausalLM", ("ForCausalLM", "LMHeadModel")),
    "fill-mask": ("AutoModelForMaskedLM", ("ForMaskedLM",)),
    "text-classification": ("AutoModelForSequenceClassification",
                            ("ForSequenceClassification",)),
    "token-classification": ("AutoModelForTokenClassification", ("ForTokenClassification",)),
    "image-classification": ("AutoModelForImageClassification", ("ForImageClassification",)),
    "feature-extraction": ("AutoModel", ("Model",)),
}
MAIN_INPUTS = ("input_ids", "pixel_values")   # what the supported tasks' models take


def is_model_folder(ref) -> bool:
    p = Path(ref)
    return p.is_dir() and (p / "config.json").is_file()


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """What `prepare` gives the exporter."""
    task: str
    model: torch.nn.Module
    inputs: tuple
    dynamic_shapes: tuple | None
    value_ranges: list
    decode: bool
    max_cache_len: int | None            # generators: the cache length that fits the model
    attachments: dict                    # artifact path -> bytes (the tokenizer files)
    notes: tuple = ()                    # what the user should hear about (progress lines)


def read_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{folder}/config.json is not readable JSON", where=str(folder),
                         expected="a config.json written by save_pretrained",
                         found=f"{type(e).__name__}: {e}"[:200],
                         fix="save the model with model.save_pretrained(DIR)") from None
    if not isinstance(config, dict):
        raise UsageError(f"{folder}/config.json is not an object", where=str(folder),
                         expected="a JSON object", found=type(config).__name__,
                         fix="save the model with model.save_pretrained(DIR)")
    return config


def _refuse_task(task: str, where: str, found) -> UsageError:
    return UsageError(f"task {task!r} is not one aotc exports from a model folder",
                      where=where, expected=f"one of {', '.join(TASKS)}", found=found,
                      fix="pass --task with one of those (object detection and speech models "
                          "are not exported from folders yet: write a FILE.py:Name factory)")


def default_task(config: dict, folder: Path) -> str:
    """The task config.architectures names (its first class whose name ends as a task's)."""
    archs = config.get("architectures") or []
    for arch in archs if isinstance(archs, list) else []:
        for task, (_, endings) in TASKS.items():
            if isinstance(arch, str) and arch.endswith(endings):
                return task
    raise UsageError(f"{folder}/config.json names no architecture of a task aotc exports",
                     where="config.architectures", expected=f"a class of one of the tasks "
                     f"{', '.join(TASKS)}", found=archs,
                     fix="pass --task with one of those tasks")


def load_model(folder: Path, task: str) -> torch.nn.Module:
    """The task's auto class `from_pretrained(folder)`: the folder's real weights."""
    import transformers
    auto = getattr(transformers, TASKS[task][0])
    try:
        with quiet():    # transformers' progress bars and notices (shown with aotc --debug)
            model = auto.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as e:
        raise ExportError(f"transformers could not load {folder} for {task}: "
                          f"{type(e).__name__}: {str(e)[:300]}", where=str(folder),
                          expected=f"a folder {TASKS[task][0]}.from_pretrained loads "
                          "(config.json and safetensors weights)", found=type(e).__name__,
                          fix="check the folder loads in transformers, and that --task "
                              "matches its architecture") from e
    main = getattr(model, "main_input_name", "input_ids")
    if main not in MAIN_INPUTS:
        raise _refuse_task(task, str(folder), f"a model taking {main}")
    return model.eval()


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _positions(config) -> int | None:
    cfg = _text_config(config)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 1:
            return value
    return None


def _vocab(config) -> int:
    cfg = _text_config(config)
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise ExportError("the config gives no vocabulary size", where="config.vocab_size",
                          expected="a positive int", found=vocab,
                          fix="export with a FILE.py:Name factory and --example-input")
    return vocab


def keyword_forward(model: torch.nn.Module, names: tuple[str, ...]) -> torch.nn.Module:
    """The model, its class swapped for a subclass whose forward takes `names` by position
    and passes them by keyword (transformers models take attention_mask at different
    positions); weights keep their names, and errors point into the model's own file."""
    cls = type(model)

    def forward(self, *args):
        return cls.forward(self, **dict(zip(names, args)))
    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("self", *names)])
    model.__class__ = type(cls.__name__, (cls,), {"forward": forward,
                                                  "__module__": cls.__module__})
    return model


def text_inputs(model, batch: int, seq: int):
    """input_ids and attention_mask (where forward takes one), batch and seq dynamic."""
    vocab = _vocab(model.config)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    names = ("input_ids", "attention_mask") if "attention_mask" in \
        inspect.signature(model.forward).parameters else ("input_ids",)
    inputs = (ids, torch.ones(batch, seq, dtype=torch.int64))[:len(names)]
    b = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    s = torch.export.Dim("seq", min=1, max=_positions(model.config) or 1 << 16)
    keyword_forward(model, names)
    return inputs, tuple({0: b, 1: s} for _ in names), [(0, vocab - 1), (0, 1)][:len(names)]


def pixel_inputs(model, batch: int, image_size: int | None):
    cfg = model.config
    size = image_size or getattr(cfg, "image_size", None)
    size = size if isinstance(size, int) else (size or [224])[0]
    channels = getattr(cfg, "num_channels", 3)
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randn(batch, channels, size, size, generator=gen)
    keyword_forward(model, ("pixel_values",))
    return (pixels,), ({0: torch.export.Dim("batch", min=1, max=MAX_BATCH)},), [None]


def tokenizer_attachments(folder: Path) -> dict:
    """The folder's tokenizer files, checked as loading checks them, by artifact path."""
    from aotc.runtime.tokenizer import check_files, read_folder
    files = read_folder(folder)
    if fmt.TOKENIZER_JSON not in files:     # none, or a slow tokenizer only (vocab files)
        return {}
    check_files(files, str(folder))
    return {fmt.tokenizer_file(name): data for name, data in files.items()}


def prepare(folder, task: str | None, batch: int | None, seq_len: int | None,
            image_size: int | None, max_cache_len: int) -> Prepared:
    folder = Path(folder)
    config = read_config(folder)
    task = task or default_task(config, folder)
    if task not in TASKS:
        raise _refuse_task(task, "--task", task)
    model = load_model(folder, task)
    attachments = tokenizer_attachments(folder)
    notes = () if attachments or model.main_input_name != "input_ids" else (
        f"{folder} has no {fmt.TOKENIZER_JSON}: the artifact carries no tokenizer (save a fast "
        "tokenizer beside the model, tokenizer.save_pretrained(DIR), for text in and out)",)
    seq = seq_len or DEFAULT_SEQ
    if task == "text-generation":
        positions = _positions(model.config)
        cache = min(max_cache_len, positions) if positions else max_cache_len
        gen = torch.Generator().manual_seed(0)
        vocab = _vocab(model.config)
        ids = torch.randint(0, vocab, (batch or 1, seq), generator=gen)
        return Prepared(task=task, model=model, inputs=(ids,), dynamic_shapes=None,
                        value_ranges=[(0, vocab - 1)], decode=True, max_cache_len=cache,
                        attachments=attachments, notes=notes)
    for cfg in {id(c): c for c in (model.config, _text_config(model.config))}.values():
        cfg.use_cache = False         # no cache object among the outputs of a plain forward
    if model.main_input_name == "pixel_values":
        inputs, dyn, ranges = pixel_inputs(model, batch or 2, image_size)
    else:
        inputs, dyn, ranges = text_inputs(model, batch or 2, seq)
    return Prepared(task=task, model=model, inputs=inputs, dynamic_shapes=dyn, value_ranges=ranges,
                    decode=False, max_cache_len=None, attachments=attachments, notes=notes)
