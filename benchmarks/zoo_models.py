"""The zoo's models: a breadth of real architectures (transformers, torchvision, timm) built from
configs with random weights, at CPU-sized configs ('small') and published sizes ('full').

Each entry is a `benchmarks.models.ModelSpec`, so the zoo and the timed suite build models the
same way. The zoo runs one point per model (batch 2 at 'small': batch 1 hides bugs in batch
strides). Nothing is downloaded; models whose library is missing are reported as skipped.
Models that take several inputs are wrapped in `Keywords`, which passes them by name (the
wrapped architecture is unchanged).
"""
from __future__ import annotations

import torch
from torch import nn

from benchmarks.models import ModelSpec, hf, tv

ZOO_BATCHES = {"small": (2, 2), "full": (1, 8)}
SEQ = {"small": 32, "full": 128}


class Keywords(nn.Module):
    """Calls `model(**dict(zip(names, inputs)))`: transformers models take their second input
    (decoder ids, pixel values) by keyword, not by position."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs)))


def hf_kw(model_cls: str, config_cls: str, names: tuple[str, ...]):
    inner = hf(model_cls, config_cls)
    return lambda cfg: Keywords(inner(cfg), names)


def timm_model(name: str):
    def build(cfg):
        import timm
        return timm.create_model(name, pretrained=False, **cfg)
    return build


# ------------------------------------------------------------------------------------ inputs
def ids(vocab: int = 1000, seq=SEQ, decoder: int | None = None):
    """Token ids (batch, seq) in [0, vocab); with `decoder`, decoder ids of that length too."""
    def make(size, batch, gen):
        out = (torch.randint(0, vocab, (batch, seq[size]), generator=gen),)
        if decoder:
            out += (torch.randint(0, vocab, (batch, decoder), generator=gen),)
        return out
    return make


def ids_mask(vocab: int = 1000, seq=SEQ, decoder: int = 8):
    """Token ids, an attention mask whose second row pads its last quarter, and decoder ids:
    for models whose traced path builds masks from `attention_mask` (eager makes one itself)."""
    def make(size, batch, gen):
        n = seq[size]
        mask = torch.ones(batch, n, dtype=torch.long)
        mask[1:, n - n // 4:] = 0
        return (torch.randint(0, vocab, (batch, n), generator=gen), mask,
                torch.randint(0, vocab, (batch, decoder), generator=gen))
    return make


def pixels(res: dict | int = 64):
    res = res if isinstance(res, dict) else {"small": res, "full": 224}
    return lambda size, batch, gen: (torch.randn(batch, 3, res[size], res[size], generator=gen),)


def floats(*shape: int, then_ids: tuple[int, int] | None = None):
    """A float tensor (batch, *shape); with `then_ids` (vocab, length), decoder ids after it."""
    def make(size, batch, gen):
        out = (torch.randn(batch, *shape, generator=gen),)
        if then_ids:
            out += (torch.randint(0, then_ids[0], (batch, then_ids[1]), generator=gen),)
        return out
    return make


def text_and_image(vocab: int, seq: int, res: int):
    def make(size, batch, gen):
        return (torch.randint(0, vocab, (batch, seq), generator=gen),
                torch.randn(batch, 3, res, res, generator=gen))
    return make


def masking_noise(res: int, patches: int):
    """Pixels and the uniform noise ViTMAE ranks patches by (eager would draw it itself)."""
    def make(size, batch, gen):
        return (torch.randn(batch, 3, res, res, generator=gen),
                torch.rand(batch, patches, generator=gen))
    return make


def xmod(cfg):
    """X-MOD with its default language set (it refuses to run without one)."""
    from transformers import XmodConfig, XmodModel
    model = XmodModel(XmodConfig(**cfg))
    model.set_default_language("en_XX")
    return model


def spec(name, family, requires, build, small, inputs, full=None) -> ModelSpec:
    return ModelSpec(name=name, family=family, requires=requires, build=build,
                     configs={"small": small, "full": full or {}}, inputs=inputs,
                     batches=ZOO_BATCHES)


def hf_spec(name, model_cls, config_cls, small, inputs=None, names=None, full=None):
    build = hf_kw(model_cls, config_cls, names) if names else hf(model_cls, config_cls)
    return spec(name, "transformers", "transformers", build, small, inputs or ids(), full)


# ------------------------------------------------------------------------------------ configs
BERTISH = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, max_position_embeddings=128)
LLAMAISH = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128,
                use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BARTISH = dict(vocab_size=1000, d_model=64, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
               decoder_ffn_dim=128, max_position_embeddings=128, use_cache=False,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
T5ISH = dict(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_decoder_layers=1,
             num_heads=4, use_cache=False)
VITISH = dict(image_size=64, patch_size=8, hidden_size=64, num_hidden_layers=2,
              num_attention_heads=4, intermediate_size=128)
AUDIO = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             conv_dim=(32, 32), conv_kernel=(10, 3), conv_stride=(5, 2),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
SEQ2SEQ = ("input_ids", "decoder_input_ids")
SEQ2SEQ_MASK = ("input_ids", "attention_mask", "decoder_input_ids")

TRANSFORMERS = (
    # encoders
    *(hf_spec(n, m, c, BERTISH) for n, m, c in (
        ("bert", "BertModel", "BertConfig"), ("roberta", "RobertaModel", "RobertaConfig"),
        ("electra", "ElectraModel", "ElectraConfig"),
        ("xlm_roberta", "XLMRobertaModel", "XLMRobertaConfig"),
        ("roformer", "RoFormerModel", "RoFormerConfig"), ("mpnet", "MPNetModel", "MPNetConfig"),
        ("deberta", "DebertaModel", "DebertaConfig"),
        ("deberta_v2", "DebertaV2Model", "DebertaV2Config"),
        ("convbert", "ConvBertModel", "ConvBertConfig"))),
    hf_spec("squeezebert", "SqueezeBertModel", "SqueezeBertConfig",
            dict(BERTISH, embedding_size=64)),
    hf_spec("albert", "AlbertModel", "AlbertConfig", dict(BERTISH, embedding_size=32)),
    hf_spec("mobilebert", "MobileBertModel", "MobileBertConfig",
            dict(BERTISH, embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32,
                 num_feedforward_networks=2)),
    hf_spec("distilbert", "DistilBertModel", "DistilBertConfig",
            dict(vocab_size=1000, n_layers=2, dim=64, n_heads=4, hidden_dim=128,
                 max_position_embeddings=128)),
    hf_spec("esm", "EsmModel", "EsmConfig", dict(BERTISH, vocab_size=33, pad_token_id=1),
            inputs=ids(33)),
    hf_spec("modernbert", "ModernBertModel", "ModernBertConfig",
            dict(BERTISH, global_attn_every_n_layers=2, local_attention=16, pad_token_id=0,
                 bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    # decoders
    *(hf_spec(n, m, c, LLAMAISH) for n, m, c in (
        ("llama", "LlamaModel", "LlamaConfig"), ("mistral", "MistralModel", "MistralConfig"),
        ("qwen2", "Qwen2Model", "Qwen2Config"), ("qwen3", "Qwen3Model", "Qwen3Config"),
        ("phi3", "Phi3Model", "Phi3Config"), ("olmo", "OlmoModel", "OlmoConfig"),
        ("stablelm", "StableLmModel", "StableLmConfig"),
        ("starcoder2", "Starcoder2Model", "Starcoder2Config"))),
    hf_spec("gemma", "GemmaModel", "GemmaConfig", dict(LLAMAISH, head_dim=16)),
    hf_spec("gemma2", "Gemma2Model", "Gemma2Config", dict(LLAMAISH, head_dim=16,
                                                         sliding_window=16)),
    hf_spec("phi", "PhiModel", "PhiConfig", dict(LLAMAISH, num_key_value_heads=4)),
    hf_spec("gpt2", "GPT2Model", "GPT2Config",
            dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                 use_cache=False)),
    hf_spec("gpt_neo", "GPTNeoModel", "GPTNeoConfig",
            dict(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
                 attention_types=[[["global", "local"], 1]], window_size=16,
                 max_position_embeddings=128, use_cache=False)),
    hf_spec("gpt_neox", "GPTNeoXModel", "GPTNeoXConfig", dict(LLAMAISH)),
    hf_spec("gptj", "GPTJModel", "GPTJConfig",
            dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                 n_positions=128, use_cache=False)),
    hf_spec("codegen", "CodeGenModel", "CodeGenConfig",
            dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                 n_positions=128, n_ctx=128, use_cache=False)),
    hf_spec("opt", "OPTModel", "OPTConfig",
            dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                 num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=128,
                 use_cache=False)),
    hf_spec("bloom", "BloomModel", "BloomConfig",
            dict(vocab_size=1000, hidden_size=64, n_layer=2, n_head=4, use_cache=False)),
    hf_spec("falcon", "FalconModel", "FalconConfig",
            dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 use_cache=False)),
    # mixture of experts
    hf_spec("mixtral", "MixtralModel", "MixtralConfig",
            dict(LLAMAISH, num_local_experts=4, num_experts_per_tok=2)),
    hf_spec("qwen2_moe", "Qwen2MoeModel", "Qwen2MoeConfig",
            dict(LLAMAISH, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                 shared_expert_intermediate_size=64)),
    # encoder-decoders
    hf_spec("t5", "T5Model", "T5Config", T5ISH, ids(decoder=8), SEQ2SEQ),
    hf_spec("mt5", "MT5Model", "MT5Config", T5ISH, ids(decoder=8), SEQ2SEQ),
    hf_spec("switch_transformers", "SwitchTransformersModel", "SwitchTransformersConfig",
            dict(T5ISH, num_experts=4, num_sparse_encoder_layers=1,
                 num_sparse_decoder_layers=1), ids_mask(), SEQ2SEQ_MASK),
    *(hf_spec(n, m, c, BARTISH, ids(decoder=8), SEQ2SEQ) for n, m, c in (
        ("bart", "BartModel", "BartConfig"), ("mbart", "MBartModel", "MBartConfig"),
        ("marian", "MarianModel", "MarianConfig"), ("pegasus", "PegasusModel", "PegasusConfig"),
        ("blenderbot_small", "BlenderbotSmallModel", "BlenderbotSmallConfig"))),
    # audio
    hf_spec("wav2vec2", "Wav2Vec2Model", "Wav2Vec2Config", AUDIO, floats(4000)),
    hf_spec("hubert", "HubertModel", "HubertConfig", AUDIO, floats(4000)),
    hf_spec("wavlm", "WavLMModel", "WavLMConfig", dict(AUDIO, num_buckets=32), floats(4000)),
    hf_spec("whisper", "WhisperModel", "WhisperConfig",
            dict(BARTISH, num_mel_bins=16, max_source_positions=32, max_target_positions=64),
            floats(16, 64, then_ids=(1000, 8)), ("input_features", "decoder_input_ids")),
    hf_spec("audio_spectrogram", "ASTModel", "ASTConfig",
            dict(VITISH, num_mel_bins=32, max_length=64, patch_size=16,
                 frequency_stride=16, time_stride=16), floats(64, 32), ("input_values",)),
    # vision
    *(hf_spec(n, m, c, VITISH, pixels(), ("pixel_values",)) for n, m, c in (
        ("vit", "ViTModel", "ViTConfig"), ("deit", "DeiTModel", "DeiTConfig"),
        ("beit", "BeitModel", "BeitConfig"), ("dinov2", "Dinov2Model", "Dinov2Config"))),
    hf_spec("swin", "SwinModel", "SwinConfig",
            dict(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1, 1, 1],
                 num_heads=[1, 2, 4, 8], window_size=2), pixels(), ("pixel_values",)),
    hf_spec("convnext_hf", "ConvNextModel", "ConvNextConfig",
            dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]), pixels(),
            ("pixel_values",)),
    hf_spec("resnet_hf", "ResNetModel", "ResNetConfig",
            dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
            pixels(), ("pixel_values",)),
    hf_spec("segformer", "SegformerModel", "SegformerConfig",
            dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                 decoder_hidden_size=64), pixels(), ("pixel_values",)),
    hf_spec("mobilevit_hf", "MobileViTModel", "MobileViTConfig",
            dict(image_size=64, hidden_sizes=[48, 64, 80], neck_hidden_sizes=[
                16, 16, 24, 32, 48, 64, 160]), pixels(), ("pixel_values",)),
    # multimodal
    hf_spec("clip", "CLIPModel", "CLIPConfig",
            dict(text_config=dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=32),
                 vision_config=dict(VITISH, patch_size=16), projection_dim=32),
            text_and_image(1000, 16, 64), ("input_ids", "pixel_values")),
    # breadth added 2026-12-05: more encoders, decoders, encoder-decoders, vision and audio
    hf_spec("xlnet", "XLNetModel", "XLNetConfig",
            dict(vocab_size=1000, d_model=64, n_layer=2, n_head=4, d_inner=128, use_mems_eval=False)),
    hf_spec("funnel", "FunnelModel", "FunnelConfig",
            dict(vocab_size=1000, block_sizes=[1, 1], num_decoder_layers=1, d_model=64, n_head=4,
                 d_head=16, d_inner=128)),
    hf_spec("longformer", "LongformerModel", "LongformerConfig",
            dict(BERTISH, attention_window=[8, 8], pad_token_id=1, max_position_embeddings=130)),
    hf_spec("big_bird", "BigBirdModel", "BigBirdConfig",
            dict(BERTISH, attention_type="original_full")),
    hf_spec("layoutlm", "LayoutLMModel", "LayoutLMConfig", BERTISH),
    hf_spec("canine", "CanineModel", "CanineConfig",
            dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=128, num_hash_buckets=64, local_transformer_stride=4,
                 downsampling_rate=4), ids(1000)),
    hf_spec("fnet", "FNetModel", "FNetConfig",
            dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                 max_position_embeddings=128)),
    hf_spec("nystromformer", "NystromformerModel", "NystromformerConfig",
            dict(BERTISH, num_landmarks=8, segment_means_seq_len=32, max_position_embeddings=130)),
    hf_spec("ibert", "IBertModel", "IBertConfig", dict(BERTISH, max_position_embeddings=130)),
    hf_spec("megatron_bert", "MegatronBertModel", "MegatronBertConfig", BERTISH),
    hf_spec("rembert", "RemBertModel", "RemBertConfig",
            dict(BERTISH, input_embedding_size=32, output_embedding_size=32)),
    spec("xmod", "transformers", "transformers", xmod, dict(BERTISH, max_position_embeddings=130),
         ids()),
    hf_spec("data2vec_text", "Data2VecTextModel", "Data2VecTextConfig",
            dict(BERTISH, max_position_embeddings=130)),
    hf_spec("ernie", "ErnieModel", "ErnieConfig", BERTISH),
    hf_spec("luke", "LukeModel", "LukeConfig", dict(BERTISH, entity_vocab_size=32,
                                                   entity_emb_size=32)),
    hf_spec("markuplm", "MarkupLMModel", "MarkupLMConfig", dict(BERTISH, max_position_embeddings=130)),
    hf_spec("mra", "MraModel", "MraConfig", dict(BERTISH, max_position_embeddings=130)),
    hf_spec("yoso", "YosoModel", "YosoConfig", dict(BERTISH, max_position_embeddings=130)),
    # decoders
    *(hf_spec(n, m, c, dict(LLAMAISH, head_dim=16)) for n, m, c in (
        ("cohere", "CohereModel", "CohereConfig"), ("cohere2", "Cohere2Model", "Cohere2Config"),
        ("granite", "GraniteModel", "GraniteConfig"), ("olmo2", "Olmo2Model", "Olmo2Config"),
        ("glm", "GlmModel", "GlmConfig"), ("glm4", "Glm4Model", "Glm4Config"),
        ("helium", "HeliumModel", "HeliumConfig"), ("nemotron", "NemotronModel", "NemotronConfig"),
        ("persimmon", "PersimmonModel", "PersimmonConfig"),
        ("exaone4", "Exaone4Model", "Exaone4Config"), ("smollm3", "SmolLM3Model", "SmolLM3Config"),
        ("ministral", "MinistralModel", "MinistralConfig"), ("arcee", "ArceeModel", "ArceeConfig"),
        ("seed_oss", "SeedOssModel", "SeedOssConfig"), ("hunyuan_v1_dense", "HunYuanDenseV1Model",
                                                          "HunYuanDenseV1Config"))),
    hf_spec("gemma3_text", "Gemma3TextModel", "Gemma3TextConfig", dict(LLAMAISH, head_dim=16,
                                                                     sliding_window=16)),
    hf_spec("gpt_bigcode", "GPTBigCodeModel", "GPTBigCodeConfig",
            dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128, use_cache=False)),
    hf_spec("mpt", "MptModel", "MptConfig",
            dict(vocab_size=1000, d_model=64, n_layers=2, n_heads=4, max_seq_len=128, use_cache=False)),
    hf_spec("biogpt", "BioGptModel", "BioGptConfig", dict(BERTISH, use_cache=False)),
    hf_spec("ctrl", "CTRLModel", "CTRLConfig",
            dict(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, dff=128, n_positions=128, use_cache=False)),
    hf_spec("xglm", "XGLMModel", "XGLMConfig",
            dict(vocab_size=1000, d_model=64, num_layers=2, attention_heads=4, ffn_dim=128,
                 max_position_embeddings=128, use_cache=False)),
    hf_spec("qwen3_moe", "Qwen3MoeModel", "Qwen3MoeConfig",
            dict(LLAMAISH, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)),
    hf_spec("olmoe", "OlmoeModel", "OlmoeConfig", dict(LLAMAISH, num_experts=4, num_experts_per_tok=2)),
    hf_spec("granitemoe", "GraniteMoeModel", "GraniteMoeConfig",
            dict(LLAMAISH, num_local_experts=4, num_experts_per_tok=2)),
    hf_spec("phimoe", "PhimoeModel", "PhimoeConfig", dict(LLAMAISH, num_local_experts=4,
                                                         num_experts_per_tok=2)),
    hf_spec("mamba", "MambaModel", "MambaConfig",
            dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, state_size=8, use_cache=False)),
    hf_spec("mamba2", "Mamba2Model", "Mamba2Config",
            dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, state_size=8, num_heads=4,
                 head_dim=32, n_groups=1, chunk_size=16, use_cache=False)),
    hf_spec("rwkv", "RwkvModel", "RwkvConfig",
            dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, attention_hidden_size=64,
                 intermediate_size=128, context_length=128, use_cache=False)),
    hf_spec("recurrent_gemma", "RecurrentGemmaModel", "RecurrentGemmaConfig",
            dict(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=1, intermediate_size=128, lru_width=64, attention_window_size=16,
                 head_dim=16, use_cache=False)),
    # encoder-decoders
    *(hf_spec(n, m, c, BARTISH, ids(decoder=8), SEQ2SEQ) for n, m, c in (
        ("m2m_100", "M2M100Model", "M2M100Config"), ("plbart", "PLBartModel", "PLBartConfig"),
        ("blenderbot", "BlenderbotModel", "BlenderbotConfig"),
        ("led", "LEDModel", "LEDConfig"))),
    hf_spec("prophetnet", "ProphetNetModel", "ProphetNetConfig",
            dict(vocab_size=1000, hidden_size=64, encoder_ffn_dim=128, decoder_ffn_dim=128,
                 num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=4,
                 num_decoder_attention_heads=4, ngram=2, num_buckets=8, relative_max_distance=16,
                 max_position_embeddings=128, use_cache=False), ids(decoder=8), SEQ2SEQ),
    hf_spec("longt5", "LongT5Model", "LongT5Config", dict(T5ISH, local_radius=4), ids_mask(),
            SEQ2SEQ_MASK),
    hf_spec("umt5", "UMT5Model", "UMT5Config", T5ISH, ids(decoder=8), SEQ2SEQ),
    # vision
    *(hf_spec(n, m, c, VITISH, pixels(), ("pixel_values",)) for n, m, c in (
        ("vit_msn", "ViTMSNModel", "ViTMSNConfig"),
        ("data2vec_vision", "Data2VecVisionModel", "Data2VecVisionConfig"),
        ("ijepa", "IJepaModel", "IJepaConfig"))),
    hf_spec("vit_mae", "ViTMAEModel", "ViTMAEConfig", VITISH, masking_noise(64, 64),
            ("pixel_values", "noise")),   # its random masking given as an input
    hf_spec("siglip_vision", "SiglipVisionModel", "SiglipVisionConfig", VITISH, pixels(),
            ("pixel_values",)),
    hf_spec("swinv2", "Swinv2Model", "Swinv2Config",
            dict(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1, 1, 1],
                 num_heads=[1, 2, 4, 8], window_size=2), pixels(), ("pixel_values",)),
    hf_spec("convnextv2", "ConvNextV2Model", "ConvNextV2Config",
            dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]), pixels(), ("pixel_values",)),
    hf_spec("pvt_v2", "PvtV2Model", "PvtV2Config",
            dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 4, 8]),
            pixels(), ("pixel_values",)),
    hf_spec("regnet_hf", "RegNetModel", "RegNetConfig",
            dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], groups_width=8),
            pixels(), ("pixel_values",)),
    hf_spec("mobilenet_v2_hf", "MobileNetV2Model", "MobileNetV2Config", dict(image_size=64),
            pixels(), ("pixel_values",)),
    hf_spec("efficientnet_hf", "EfficientNetModel", "EfficientNetConfig",
            dict(image_size=64, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320),
            pixels(),
            ("pixel_values",)),
    hf_spec("levit_hf", "LevitModel", "LevitConfig",
            dict(image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 4],
                 depths=[1, 1, 1], key_dim=[8, 8, 8]), pixels(), ("pixel_values",)),
    hf_spec("poolformer_hf", "PoolFormerModel", "PoolFormerConfig",
            dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]), pixels(), ("pixel_values",)),
    hf_spec("hiera", "HieraModel", "HieraConfig",
            dict(image_size=[64, 64], embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8]),
            pixels(), ("pixel_values",)),
    hf_spec("dpt", "DPTModel", "DPTConfig", dict(VITISH, image_size=64), pixels(), ("pixel_values",)),
    hf_spec("glpn", "GLPNModel", "GLPNConfig",
            dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], decoder_hidden_size=32,
                 num_attention_heads=[1, 2, 4, 8]), pixels(), ("pixel_values",)),
    # audio
    *(hf_spec(n, m, c, AUDIO, floats(4000)) for n, m, c in (
        ("sew", "SEWModel", "SEWConfig"), ("unispeech", "UniSpeechModel", "UniSpeechConfig"),
        ("data2vec_audio", "Data2VecAudioModel", "Data2VecAudioConfig"))),
    hf_spec("sew_d", "SEWDModel", "SEWDConfig", dict(AUDIO, position_buckets=32, max_position_embeddings=128),
            floats(4000)),
    hf_spec("speech_to_text", "Speech2TextModel", "Speech2TextConfig",
            dict(BARTISH, input_feat_per_channel=16, max_source_positions=64, max_target_positions=64,
                 conv_channels=32), floats(64, 16, then_ids=(1000, 8)),
            ("input_features", "decoder_input_ids")),
)

TORCHVISION = tuple(
    spec(name, "torchvision", "torchvision", tv(fn), cfg, pixels(res))
    for name, fn, cfg, res in (
        ("resnet18", "resnet18", {}, 64), ("resnet50", "resnet50", {}, 64),
        ("vgg11_bn", "vgg11_bn", {}, 64), ("alexnet", "alexnet", {}, 64),
        ("squeezenet1_1", "squeezenet1_1", {}, 64), ("densenet121", "densenet121", {}, 64),
        ("googlenet", "googlenet", {"aux_logits": False, "init_weights": False}, 64),
        ("mobilenet_v2", "mobilenet_v2", {}, 64),
        ("mobilenet_v3_large", "mobilenet_v3_large", {}, 64),
        ("mnasnet0_5", "mnasnet0_5", {}, 64),
        ("shufflenet_v2_x0_5", "shufflenet_v2_x0_5", {}, 64),
        ("efficientnet_b0", "efficientnet_b0", {}, 64),
        ("regnet_y_400mf", "regnet_y_400mf", {}, 64), ("convnext_tiny", "convnext_tiny", {}, 64),
        ("swin_t", "swin_t", {}, 64), ("maxvit_t", "maxvit_t", {}, {"small": 224, "full": 224}),
        ("vit_b_16", "vit_b_16", {"image_size": 64}, {"small": 64, "full": 224}),
        ("fcn_resnet50", "segmentation.fcn_resnet50",
         {"weights_backbone": None, "aux_loss": False}, 64),
        ("lraspp_mobilenet_v3", "segmentation.lraspp_mobilenet_v3_large",
         {"weights_backbone": None}, 64),
        ("ssdlite320_mobilenet_v3", "detection.ssdlite320_mobilenet_v3_large",
         {"weights_backbone": None}, {"small": 320, "full": 320}),
    ))

TIMM = tuple(
    spec(name, "timm", "timm", timm_model(name), cfg, pixels(res))
    for name, cfg, res in (
        ("mobilevitv2_050", {}, 64), ("resnet18d", {}, 64), ("efficientnet_b0", {}, 64),
        ("convnext_atto", {}, 64), ("vit_tiny_patch16_224", {"img_size": 64}, 64),
        ("regnetx_002", {}, 64), ("ghostnet_100", {}, 64), ("dla34", {}, 64),
        ("edgenext_xx_small", {}, 64), ("fastvit_t8", {}, 64), ("repvit_m1", {}, 64),
        ("lcnet_050", {}, 64), ("mixer_s16_224", {"img_size": 64}, 64),
        ("levit_128s", {"img_size": 64}, 64), ("poolformer_s12", {}, 64),
    ))

ZOO: tuple[ModelSpec, ...] = TRANSFORMERS + TORCHVISION + TIMM


def zoo_spec(name: str) -> ModelSpec:
    """The zoo model `name` ('family/name' or a unique 'name')."""
    family, _, short = name.rpartition("/")
    if family.endswith("-sweep"):
        from benchmarks.zoo_sweep import sweep_spec
        return sweep_spec(family, short)
    found = [s for s in ZOO if s.name == short and family in ("", s.family)]
    if len(found) != 1:
        raise ValueError(f"zoo has {len(found)} models named {name!r}; known: "
                         f"{', '.join(qualified(s) for s in ZOO)}")
    return found[0]


def qualified(s: ModelSpec) -> str:
    return f"{s.family}/{s.name}"
