"""The transformers sweep: every model type of transformers' `AutoModel` table whose model takes
token ids or pixels, built from its own default config shrunk to a CPU size.

    python -m benchmarks.zoo --families transformers-sweep --no-compile --out DIR
    python -m benchmarks.zoo --models transformers-sweep/llama --no-compile

A model type joins when its `AutoModel` class's main input is `input_ids` or `pixel_values`, its
config has no sub-configs (multimodal models take several kinds of input), and the zoo's own
entries (benchmarks/zoo_models.py) do not have it already. Its config is
the type's default with every size field it has shrunk (`shrunk`: width 64, 2 layers, 4 heads,
128 wide feed-forwards, at most 4 experts, vocabularies of 1000, images of 64 pixels, stages of
one block), made through the config's own constructor so that what it derives (head sizes,
layer types) follows. The model is built on the meta device first and skipped above
MAX_PARAMS (a size field the rules do not know). Inputs: token ids (2, 32), with decoder ids
(2, 8) for encoder-decoders; or pixels (2, channels, 64, 64). A model that does not build or
run eagerly so is reported `build_failed`, apart from aotc's results.
"""
from __future__ import annotations

import functools

import torch

from benchmarks.models import ModelSpec, quietly
from benchmarks.zoo_models import SEQ, ZOO_BATCHES, Keywords

FAMILY = "transformers-sweep"
MAX_PARAMS = 40_000_000
INPUTS = ("input_ids", "pixel_values")
WIDTH = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim", "emb_dim")
LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
          "decoder_layers", "num_decoder_layers", "num_encoder_layers")
HEADS = ("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
         "decoder_attention_heads", "num_heads", "attention_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
FFN = ("intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim", "ffn_dim", "d_ff", "n_inner",
       "dff", "ffn_hidden_size")
SMALL = {"head_dim": 16, "d_kv": 16, "kv_lora_rank": 32, "q_lora_rank": 48,
         "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "index_head_dim": 16,
         "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
         "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
         "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "n_shared_experts": 1,
         "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "image_size": 64,
         "moe_k": 2, "num_experts_per_token": 2, "moe_num_shared_experts": 1,
         "num_shared_experts": 1, "num_expert_group": 1,
         "sliding_window": 16, "window_size": 2, "rotary_dim": 8, "entity_vocab_size": 1000,
         "max_position_embeddings": 512, "vocab_size": 1000}
LISTS = {"depths": 1, "hidden_sizes": (16, 32, 64, 128), "num_heads": (1, 2, 4, 8),
         "embed_dims": (16, 32, 64, 128), "num_attention_heads": (1, 2, 4, 8)}


# ------------------------------------------------------------------------------------ classes
@quietly
def classes(model_type: str):
    """(model class, config class) of `model_type`, or None if transformers lacks either."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    import transformers
    names = (MODEL_MAPPING_NAMES.get(model_type), CONFIG_MAPPING_NAMES.get(model_type))
    if not all(isinstance(n, str) for n in names):
        return None
    try:
        found = tuple(getattr(transformers, n) for n in names)
        found[0].main_input_name, found[1].sub_configs    # noqa: B018 - placeholders raise
        return found
    except Exception:       # noqa: BLE001 - an optional dependency the type needs is missing
        return None


@functools.lru_cache(maxsize=None)
def names() -> tuple[str, ...]:
    """The model types the sweep runs (see the module's doc)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    out = []
    for model_type in sorted(MODEL_MAPPING_NAMES):
        found = classes(model_type)
        if found is None or getattr(found[0], "main_input_name", None) not in INPUTS:
            continue
        if getattr(found[1], "sub_configs", None) or _in_zoo(model_type):
            continue
        out.append(model_type)
    return tuple(out)


def _in_zoo(model_type: str) -> bool:
    """Whether the zoo's hand-written transformers entries cover `model_type` already."""
    from benchmarks.zoo_models import TRANSFORMERS
    short = model_type.replace("-", "_")
    return any(s.name in (short, f"{short}_hf") for s in TRANSFORMERS)


# ------------------------------------------------------------------------------------ configs
def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shrunk(default) -> dict:
    """Keyword arguments that make `default` (a config) CPU-sized (see the module's doc)."""
    d, out = default.to_dict(), {"use_cache": False}
    for keys, value in ((WIDTH, 64), (LAYERS, 2), (HEADS, 4), (FFN, 128)):
        out.update({k: min(d[k], value) if k in LAYERS else value
                    for k in keys if _int(d.get(k)) and d[k] > 0})
    out.update({k: (1 if d[k] == 1 else 2) for k in KV_HEADS if _int(d.get(k))})
    out.update({k: min(d[k], v) for k, v in SMALL.items() if _int(d.get(k)) and d[k] > 0})
    for k, v in LISTS.items():
        if isinstance(d.get(k), (list, tuple)) and d[k] and all(_int(x) for x in d[k]):
            n = len(d[k])
            out[k] = [v] * n if _int(v) else [v[min(i, len(v) - 1)] for i in range(n)]
    _dependent(d, out)
    vocab = out.get("vocab_size", d.get("vocab_size"))
    for k, v in d.items():          # special tokens inside the smaller vocabulary
        if k.endswith("token_id") and _int(v) and _int(vocab) and v >= vocab:
            out[k] = 3 + len([x for x in out if x.endswith("token_id")])
    _per_layer(d, out)
    return out


def _dependent(d: dict, out: dict) -> None:
    """Sizes other sizes must agree with, where a config checks or a model assumes them."""
    if "qk_rope_head_dim" in out and "head_dim" in out:   # multi-head latent attention's
        out["head_dim"] = out["qk_rope_head_dim"]
    if "kv_lora_rank" in out:       # its keys are per query head
        out.update({k: 4 for k in KV_HEADS if k in out})
    if _int(d.get("expand")) and "head_dim" in out and "num_heads" in out:   # Mamba-2 heads
        out["head_dim"] = out.get("hidden_size", 64) * d["expand"] // out["num_heads"]
    if "embedding_size" in d and _int(d["embedding_size"]) and "hidden_size" in out:
        out["embedding_size"] = out["hidden_size"]
    rope = d.get("rope_parameters")
    kind = d.get("model_type", "")
    if isinstance(rope, dict) and ("mrope_section" in rope or "vl" in kind or "glm" in kind):
        half = out.get("head_dim", 16) // 2        # three sections: time, height, width
        out["rope_parameters"] = dict(rope, mrope_section=[half - 2 * (half // 3), half // 3,
                                                           half // 3])


def _per_layer(d: dict, out: dict) -> None:
    """Lists with an entry per layer (layer types, block types) cut to the shrunk depth, each
    kind of layer kept (a hybrid model needs one of each); the depth grows to the kinds."""
    for layers in (k for k in LAYERS if k in out and _int(d.get(k))):
        lists = {k: v for k, v in d.items() if isinstance(v, list) and len(v) == d[layers]
                 and len(v) > out[layers] and all(isinstance(x, (str, int)) for x in v)}
        kinds = {k: list(dict.fromkeys(v)) for k, v in lists.items()}
        n = max([out[layers], *(len(x) for x in kinds.values() if len(x) <= 4)])
        out.update({k: (kinds[k] + v)[:n] for k, v in lists.items()})
        out[layers] = n if lists else out[layers]


@functools.lru_cache(maxsize=None)
@quietly
def config(model_type: str):
    """The shrunk config of `model_type`."""
    _, config_cls = classes(model_type)
    return config_cls(**shrunk(config_cls()))


@quietly
def build(model_type: str) -> torch.nn.Module:
    model_cls, _ = classes(model_type)
    cfg = config(model_type)
    with torch.device("meta"):
        n = sum(p.numel() for p in model_cls(cfg).parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"{model_type} has {n / 1e6:.0f}M parameters shrunk (at most "
                         f"{MAX_PARAMS / 1e6:.0f}M): a size field the sweep does not shrink")
    return Keywords(model_cls(cfg), input_names(model_type))


# ------------------------------------------------------------------------------------ inputs
def input_names(model_type: str) -> tuple[str, ...]:
    model_cls, _ = classes(model_type)
    first = model_cls.main_input_name
    return (first, "decoder_input_ids") if getattr(config(model_type), "is_encoder_decoder",
                                                   False) and first == "input_ids" else (first,)


def inputs(model_type: str, size: str, batch: int, gen: torch.Generator) -> tuple:
    cfg = config(model_type)
    if classes(model_type)[0].main_input_name == "pixel_values":
        res = getattr(cfg, "image_size", 64)
        res = res if _int(res) else 64
        return (torch.randn(batch, getattr(cfg, "num_channels", 3), res, res, generator=gen),)
    vocab = getattr(cfg, "vocab_size", 1000)
    vocab = vocab if _int(vocab) and vocab > 8 else 1000
    out = (torch.randint(4, vocab, (batch, SEQ[size]), generator=gen),)
    if len(input_names(model_type)) == 2:
        out += (torch.randint(4, vocab, (batch, 8), generator=gen),)
    return out


def sweep_spec(model_type: str) -> ModelSpec:
    return ModelSpec(name=model_type, family=FAMILY, requires="transformers",
                     build=lambda cfg: build(model_type),
                     configs={s: {"size": s} for s in ("small", "full")},
                     inputs=lambda size, batch, gen: inputs(model_type, size, batch, gen),
                     batches=ZOO_BATCHES)


def sweep() -> list[ModelSpec]:
    return [sweep_spec(n) for n in names()]

