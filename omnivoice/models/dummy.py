"""`dummy:` model sources: a public architecture at full size with seeded random weights, no checkpoint.

    model.path: "dummy:qwen3-omni-30b-a3b"

builds Qwen3-Omni-30B-A3B-Instruct (every config value of the public checkpoint, 35B params), each
stage's part straight on that stage's device in its dtype, in seconds, so the GPU path can be
benchmarked at real size without the 66 GB download. Its tokenizer and log-mel feature extractor are
built from code with the real vocabulary's layout and ids (models/dummy_tokenizer.py), so the server
serves it like the checkpoint (chat, realtime, Twilio, WebRTC); `omnivoice bench engine` drives it
with token ids. The weights are transformers' own init (normal, std = initializer_range), seeded part
by part (a stage process builds its own part only, and gets what a thread layout builds); outputs are
meaningless (gibberish text, near-silent audio), shapes and costs are the real model's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

from omnivoice.config import DUMMY_MODELS
from omnivoice.models.dummy_source import DummySource
from omnivoice.models.dummy_tokenizer import added_token_id
from omnivoice.models.loader import TOOL_CALL_TOKEN, ModelSpec
from omnivoice.models.parts import PART_CLASSES
from omnivoice.models.tiny import init_talker_moe

# Ids of the real Qwen tokenizer that config.json does not record.
ENDOFTEXT_ID = 151643  # <|endoftext|>, a thinker stop token beside <|im_end|>
NEWLINE_ID = 198  # "\n" (byte-level BPE "Ċ"), used by the chat layout after every role name

_IDS = {
    "audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
    "audio_start_token_id": 151669, "audio_end_token_id": 151670, "vision_start_token_id": 151652,
}  # fmt: skip
_MROPE = {"rope_type": "default", "rope_theta": 1000000, "mrope_section": [24, 20, 20], "interleaved": True}

# Qwen3-Omni-30B-A3B-Instruct's config.json (transformers 5.x field names), every size and id set
# explicitly: the transformers class defaults are not the checkpoint's.
QWEN3_OMNI_30B_A3B: Mapping[str, Any] = {
    "thinker_config": {
        "text_config": {
            "vocab_size": 152064, "hidden_size": 2048, "intermediate_size": 768, "num_hidden_layers": 48,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu",
            "max_position_embeddings": 65536, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
            "use_cache": True, "tie_word_embeddings": False, "attention_bias": False,
            "attention_dropout": 0.0, "sliding_window": None, "decoder_sparse_step": 1,
            "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
            "norm_topk_prob": True, "output_router_logits": False,
            "router_aux_loss_coef": 0.001, "mlp_only_layers": [], "shared_expert_intermediate_size": 0,
            "rope_parameters": {**_MROPE, "mrope_interleaved": True},
        },
        "audio_config": {
            "num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
            "d_model": 1280, "output_dim": 2048, "downsample_hidden_size": 480, "activation_function": "gelu",
            "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, "scale_embedding": False,
            "initializer_range": 0.02, "max_source_positions": 1500, "conv_chunksize": 500,
            "n_window": 50, "n_window_infer": 800,
        },
        "vision_config": {
            "depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
            "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "out_hidden_size": 2048, "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [8, 16, 24], "initializer_range": 0.02,
        },
        **_IDS, "vision_end_token_id": 151653, "user_token_id": 872, "position_id_per_seconds": 13,
        "seconds_per_chunk": 2, "initializer_range": 0.02, "tie_word_embeddings": False,
    },
    "talker_config": {
        "text_config": {
            "vocab_size": 3072, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 20,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
            "max_position_embeddings": 65536, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
            "use_cache": True, "tie_word_embeddings": False, "attention_bias": False,
            "attention_dropout": 0.0, "sliding_window": None, "decoder_sparse_step": 1,
            "moe_intermediate_size": 384, "num_experts": 128, "num_experts_per_tok": 6,
            "norm_topk_prob": True, "output_router_logits": False,
            "router_aux_loss_coef": 0.001, "mlp_only_layers": [], "shared_expert_intermediate_size": 768,
            "rope_parameters": dict(_MROPE),
        },
        "code_predictor_config": {
            "vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
            "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
            "use_cache": True, "tie_word_embeddings": False, "attention_bias": False,
            "attention_dropout": 0.0, "sliding_window": None, "max_window_layers": 28, "num_code_groups": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000},
        },
        "num_code_groups": 16, "thinker_hidden_size": 2048, "accept_hidden_layer": 24,
        "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
        "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303}, **_IDS,
        "spatial_merge_size": 2, "position_id_per_seconds": 13, "seconds_per_chunk": 2,
        "output_router_logits": False, "initializer_range": 0.02, "tie_word_embeddings": False,
    },
    "code2wav_config": {
        "codebook_size": 2048, "num_quantizers": 16, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu",
        "sliding_window": 72, "max_position_embeddings": 8000, "attention_bias": False,
        "attention_dropout": 0.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000},
        "layer_scale_initial_scale": 0.01, "rms_norm_eps": 1e-5, "initializer_range": 0.02,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536,
    },
    "enable_audio_output": True, "im_start_token_id": 151644, "im_end_token_id": 151645,
    "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
    "system_token_id": 8948, "user_token_id": 872, "assistant_token_id": 77091, "initializer_range": 0.02,
}  # fmt: skip

_ARCHITECTURES: Mapping[str, Mapping[str, Any]] = {"qwen3-omni-30b-a3b": QWEN3_OMNI_30B_A3B}
assert set(_ARCHITECTURES) == set(DUMMY_MODELS), "config.DUMMY_MODELS lists the names built here"

# Every depth and width shrunk (ids, vocabularies, code groups and upsampling kept), for CPU tests of the
# same build path: `DummySource(name, overrides=REDUCED)`.
_SMALL_MOE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 8,
              "num_experts_per_tok": 2}  # fmt: skip
REDUCED: Mapping[str, Any] = {
    "thinker_config": {
        "text_config": {**_SMALL_MOE, "rope_parameters": {"mrope_section": [4, 2, 2]}},
        "audio_config": {"encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                         "d_model": 32, "output_dim": 64, "downsample_hidden_size": 8},
        "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                          "out_hidden_size": 64, "num_position_embeddings": 64,
                          "deepstack_visual_indexes": [0]},
    },
    "talker_config": {
        "text_config": {**_SMALL_MOE, "shared_expert_intermediate_size": 32,
                        "rope_parameters": {"mrope_section": [4, 2, 2]}},
        "code_predictor_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
        "thinker_hidden_size": 64, "accept_hidden_layer": 1,
    },
    "code2wav_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 4, "decoder_dim": 32},
}  # fmt: skip


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def dummy_config(source: DummySource) -> Qwen3OmniMoeConfig:
    """The transformers config of `source` (overrides merged in)."""
    return Qwen3OmniMoeConfig(**_merge(copy.deepcopy(dict(_ARCHITECTURES[source.name])), source.overrides))


def dummy_spec(source: DummySource) -> ModelSpec:
    """The engine's ModelSpec of `source`, from its config alone (no weights built)."""
    return _spec(dummy_config(source))


def _spec(config: Qwen3OmniMoeConfig) -> ModelSpec:
    # ids of the tokenizer that config.json does not record, at the real vocabulary's places
    tool_call = added_token_id(TOOL_CALL_TOKEN)
    return ModelSpec.from_config(config, endoftext_id=ENDOFTEXT_ID, tool_call_id=tool_call)


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


PARTS = ("thinker", "talker", "code2wav")


def _part_seed(source: DummySource, part: str) -> int:
    """Each part, and the thinker's embedding table, draws from a seed of its own, so a stage worker
    that builds only its part gets the weights every other layout builds."""
    return source.seed * (len(PARTS) + 1) + PARTS.index(part)


def _embed_seed(source: DummySource) -> int:
    return source.seed * (len(PARTS) + 1) + len(PARTS)


@torch.no_grad()
def build_dummy_part(source: DummySource, part: str, device: str | torch.device, dtype: torch.dtype) -> Any:
    """Build one part of `source` (thinker, talker or code2wav) with seeded random weights directly on
    `device` in `dtype` (eval mode, no grads).

    Every tensor is allocated and initialised where it lives (transformers' own init, run on the
    device), so the 35B-parameter model takes seconds on a GPU and never touches host memory. The same
    seed gives the same weights on the same device type, whichever parts are built beside it.
    """
    device = torch.device(device)
    config = getattr(dummy_config(source), f"{part}_config")
    with _seeded(device, _part_seed(source, part)), _default_dtype(dtype), device:
        model = PART_CLASSES[part]._from_config(config)
        if part == "talker":
            init_talker_moe(model)  # transformers leaves the talker's experts torch.empty
    if part == "thinker":  # reproducible alone: the talker's workers take rows of it
        model.get_input_embeddings().weight.copy_(_embedding_table(source, device, dtype))
    model.eval().requires_grad_(False)
    return model


def build_dummy_model(
    source: DummySource, device: str | torch.device, dtype: torch.dtype
) -> tuple[Qwen3OmniMoeForConditionalGeneration, ModelSpec]:
    """The whole model, as transformers' class (for its own `generate()`: the baseline), made of the
    parts `build_dummy_part` builds: the weights the stage workers serve."""
    with torch.device("meta"):  # the frame only: no memory, no init
        model = Qwen3OmniMoeForConditionalGeneration(dummy_config(source))
    for part in PARTS:
        setattr(model, part, build_dummy_part(source, part, device, dtype))
    model.eval().requires_grad_(False)
    return model, dummy_spec(source)


def dummy_tts_embeds(source: DummySource, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The thinker's embeddings of the TTS bos, eos and pad tokens [3, H], as `build_dummy_part`
    builds them, without building the thinker."""
    spec = dummy_spec(source)
    rows = torch.tensor([spec.tts_bos_id, spec.tts_eos_id, spec.tts_pad_id])
    return _embedding_table(source, torch.device(device), dtype)[rows.to(device)].clone()


def _embedding_table(source: DummySource, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The thinker's input embedding table [V, H] (normal, std = initializer_range), from its own seed."""
    thinker: Any = dummy_config(source).thinker_config  # typed loosely by transformers: a config object
    text = thinker.text_config
    with _seeded(device, _embed_seed(source)):
        table = torch.empty(text.vocab_size, text.hidden_size, device=device, dtype=dtype)
        return table.normal_(0.0, text.initializer_range)


@contextmanager
def _seeded(device: torch.device, seed: int) -> Iterator[None]:
    """Seed torch's generator of `device` for the block, and give the caller's generators back after."""
    rng_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)
        yield
