"""A tiny Qwen3-Omni checkpoint: the real architecture with seeded random weights, for tests and demos.

`build_tiny_checkpoint` writes a Hugging Face folder (config, safetensors weights, tokenizer, Whisper
feature extractor) that `load_model` / `load_processor_parts` read exactly like the real
Qwen3-Omni-30B-A3B-Instruct folder. Every config field is set explicitly because the transformers
class defaults are not the real checkpoint's (28 layers, 32 code groups, codec ids 4196+...).
Layer counts and widths are shrunk; ids, code groups, codebook size, window sizes and upsampling
ratios are the real ones so the engine's shapes and stop logic are exercised as in production.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import (
    Qwen2Tokenizer,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from omnivoice.models.build_cache import build_once
from omnivoice.models.chat_template import qwen3_omni_chat_template
from omnivoice.models.tiny_corpus import CORPUS

TINY_VERSION = "tiny-v2"  # bump whenever the recipe below changes: cached builds are keyed by it
TEXT_VOCAB_SIZE = 1024
# In the real tokenizer's relative order; they take the top ids of the vocab.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<tool_response>",
    "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<|tts_pad|>",
    "<|tts_bos|>", "<|tts_eos|>", "<|audio_pad|>",
)  # fmt: skip
# Added tokens that are plain text, as in the real tokenizer: matched whole before BPE, but kept when
# decoding with skip_special_tokens, so a tool call's tags reach the text the client gets.
TEXT_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
# Attribute names the real Qwen3-Omni tokenizer exposes (tokenizer.audio_token, ...).
EXTRA_SPECIAL_TOKENS = MappingProxyType({
    "image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
})  # fmt: skip
CODEC_IDS = MappingProxyType({  # the real checkpoint's codec control ids
    "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150,
    "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
})  # fmt: skip
SPEAKER_IDS = MappingProxyType({"chelsie": 2301, "ethan": 2302, "aiden": 2303})
AUDIBLE_PEAK = 0.3  # target peak of the vocoder's output on random codes, see _make_audible


def train_corpus_bpe(vocab_size: int) -> Tokenizer:
    """A byte-level BPE with Qwen2's normalizer and pre-tokenizer, trained on the built-in corpus."""
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(CORPUS.split("\n\n"), trainer=trainer)
    return bpe


def build_tiny_tokenizer() -> Qwen2Tokenizer:
    """Train a 1024-token byte-level BPE (Qwen2 pre-tokenizer) on the built-in corpus, offline; it
    carries Qwen3-Omni's chat template."""
    bpe = train_corpus_bpe(TEXT_VOCAB_SIZE - len(SPECIAL_TOKENS))
    vocab = bpe.get_vocab()
    first_special = TEXT_VOCAB_SIZE - len(SPECIAL_TOKENS)
    if len(vocab) != first_special:
        raise RuntimeError(f"tiny BPE learned {len(vocab)} tokens; grow the corpus")
    vocab.update({token: first_special + i for i, token in enumerate(SPECIAL_TOKENS)})
    merges = [tuple(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]
    # transformers annotates `merges` as strings and `unk_token` as a string, but hands both to
    # tokenizers' BPE, which takes merge pairs and None (no unknown token)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,  # type: ignore[arg-type]
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,  # type: ignore[arg-type]
        extra_special_tokens=dict(EXTRA_SPECIAL_TOKENS),
        model_max_length=32768,
    )
    # Register the rest as added tokens: matched whole before BPE, never split; the control tokens are
    # special (skipped when decoding with skip_special_tokens), the tags plain text.
    specials = [t for t in SPECIAL_TOKENS[1:] if t not in TEXT_TAGS]
    tokenizer.add_special_tokens({"extra_special_tokens": specials})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TAGS])
    tokenizer.chat_template = qwen3_omni_chat_template()
    ids = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    if ids != list(range(first_special, TEXT_VOCAB_SIZE)):
        raise RuntimeError(f"special tokens landed on unexpected ids {ids}")
    for role in ("system", "user", "assistant"):
        if len(tokenizer.encode(role, add_special_tokens=False)) != 1:
            raise RuntimeError(f"role name {role!r} is not a single token; grow the corpus")
    return tokenizer


def tiny_config(tokenizer: Qwen2Tokenizer) -> Qwen3OmniMoeConfig:
    """The tiny config; text-side special ids are read from `tokenizer` (they sit at the top of its vocab)."""

    def tid(token: str) -> int:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if not isinstance(token_id, int):
            raise TypeError(f"token {token!r} has ids {token_id}, not one id")
        return token_id

    ids = {
        "audio_token_id": tid("<|audio_pad|>"), "image_token_id": tid("<|image_pad|>"),
        "video_token_id": tid("<|video_pad|>"), "audio_start_token_id": tid("<|audio_start|>"),
        "audio_end_token_id": tid("<|audio_end|>"), "vision_start_token_id": tid("<|vision_start|>"),
    }  # fmt: skip
    # mrope over head_dim 16: 8 rotary pairs split T/H/W like the real [24, 20, 20] over 64 pairs.
    mrope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2], "interleaved": True}
    moe_text = {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 65536,
        "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": False,
        "attention_bias": False, "attention_dropout": 0.0, "sliding_window": None, "decoder_sparse_step": 1,
        "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "output_router_logits": False, "router_aux_loss_coef": 0.001, "mlp_only_layers": [],
    }  # fmt: skip
    thinker_text = {**moe_text, "vocab_size": TEXT_VOCAB_SIZE, "shared_expert_intermediate_size": 0,
                    "rope_parameters": {**mrope, "mrope_interleaved": True}}  # fmt: skip
    audio = {
        "num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
        "d_model": 32, "output_dim": 64, "downsample_hidden_size": 8, "activation_function": "gelu",
        "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, "scale_embedding": False,
        "initializer_range": 0.02, "max_source_positions": 1500, "conv_chunksize": 500,
        # The real values: transformers' placeholder count hard-codes 13 tokens per 100-frame chunk,
        # which only holds for n_window 50; n_window_infer / (2 * n_window) = 8 as in the real config.
        "n_window": 50, "n_window_infer": 800,
    }  # fmt: skip
    vision = {  # never used (no images), but the thinker class always builds a vision tower
        "depth": 1, "hidden_size": 16, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 32,
        "num_heads": 2, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "out_hidden_size": 64, "num_position_embeddings": 64, "deepstack_visual_indexes": [0],
        "initializer_range": 0.02,
    }  # fmt: skip
    thinker = {
        "text_config": thinker_text, "audio_config": audio, "vision_config": vision, **ids,
        "vision_end_token_id": tid("<|vision_end|>"), "user_token_id": tid("user"),
        "position_id_per_seconds": 13, "seconds_per_chunk": 2, "initializer_range": 0.02,
        "tie_word_embeddings": False,
    }  # fmt: skip
    code_predictor = {
        "vocab_size": 2048, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
        "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
        "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "attention_bias": False, "attention_dropout": 0.0, "sliding_window": None, "max_window_layers": 28,
        "num_code_groups": 16,
    }  # fmt: skip
    talker = {
        "text_config": {**moe_text, "vocab_size": 3072, "shared_expert_intermediate_size": 32,
                        "rope_parameters": mrope},
        "code_predictor_config": code_predictor, "num_code_groups": 16, "thinker_hidden_size": 64,
        "accept_hidden_layer": 1, **CODEC_IDS, "speaker_id": dict(SPEAKER_IDS), **ids,
        # spatial_merge_size is no declared field but the talker's __init__ reads it.
        "spatial_merge_size": 2, "position_id_per_seconds": 13, "seconds_per_chunk": 2,
        "output_router_logits": False, "initializer_range": 0.02, "tie_word_embeddings": False,
    }  # fmt: skip
    code2wav = {
        "codebook_size": 2048, "num_quantizers": 16, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_act": "silu",
        "sliding_window": 72, "max_position_embeddings": 8000, "attention_bias": False,
        "attention_dropout": 0.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "layer_scale_initial_scale": 0.01, "rms_norm_eps": 1e-5, "initializer_range": 0.02,
        # 8*5*4*3 * 2*2 = 1920 samples (80 ms at 24 kHz) per codec frame, as in the real vocoder.
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 32,
    }  # fmt: skip
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True,
        im_start_token_id=tid("<|im_start|>"), im_end_token_id=tid("<|im_end|>"),
        tts_pad_token_id=tid("<|tts_pad|>"), tts_bos_token_id=tid("<|tts_bos|>"),
        tts_eos_token_id=tid("<|tts_eos|>"), system_token_id=tid("system"), user_token_id=tid("user"),
        assistant_token_id=tid("assistant"), initializer_range=0.02,
    )  # fmt: skip


def tiny_feature_extractor() -> WhisperFeatureExtractor:
    """The real checkpoint's log-mel front end: 128 bins at 16 kHz, 10 ms hop, 25 ms window."""
    return WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400
    )


@torch.no_grad()
def init_talker_moe(talker: Any) -> None:
    """Give the talker's MoE experts and routers random weights (`talker`: a model's talker part).

    transformers' `_init_weights` covers the thinker's MoE blocks but not the talker's: its experts stay
    torch.empty (arbitrary memory: non-deterministic, NaN at times) and its routers all-zero (every
    token would tie and go to experts 0 and 1, leaving the routing untested).
    """
    std = talker.config.initializer_range
    for layer in talker.model.layers:
        torch.nn.init.normal_(layer.mlp.experts.gate_up_proj, mean=0.0, std=std)
        torch.nn.init.normal_(layer.mlp.experts.down_proj, mean=0.0, std=std)
        torch.nn.init.normal_(layer.mlp.gate.weight, mean=0.0, std=std)


@torch.no_grad()
def _make_audible(model: Qwen3OmniMoeForConditionalGeneration, generator: torch.Generator) -> None:
    """Scale code2wav's last conv so random codes decode to audible noise.

    With random weights the vocoder's output peaks around 1e-6: silence to a listener, and useless for
    checking that audio flows end to end. Scaling the final (linear) conv's weight and bias scales the
    waveform before the output clamp. The factor is a power of two near AUDIBLE_PEAK / peak, so the
    peak lands in ~[0.2, 0.45] and the multiply is exact: the weights do not depend on how many
    threads computed the calibration decode.
    """
    cfg: Any = model.config.code2wav_config  # typed loosely by transformers: a config object
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 25), generator=generator)
    peak = model.code2wav(codes).abs().max().item()
    scale = 2.0 ** round(math.log2(AUDIBLE_PEAK / peak))
    final = model.code2wav.decoder[-1].conv
    final.weight.mul_(scale)
    final.bias.mul_(scale)


def build_tiny_model(seed: int = 0) -> tuple[Qwen3OmniMoeForConditionalGeneration, Qwen2Tokenizer]:
    """The tiny model (eval mode) and its tokenizer, in memory; seeded, leaving the global RNG untouched."""
    tokenizer = build_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3OmniMoeForConditionalGeneration(tiny_config(tokenizer)).eval()
        init_talker_moe(model.talker)
    _make_audible(model, torch.Generator().manual_seed(seed))
    return model, tokenizer


def build_tiny_checkpoint(path: Path, seed: int = 0) -> None:
    """Write the tiny checkpoint (weights, config, tokenizer, feature extractor) into `path`.

    Deterministic: the same seed gives byte-identical files.
    """
    model, tokenizer = build_tiny_model(seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    tiny_feature_extractor().save_pretrained(path)


def ensure_tiny_checkpoint(cache_dir: Path | None = None) -> Path:
    """Return the cached tiny checkpoint's folder, building it on first use.

    It lives in `<cache_dir>/tiny-v2` (default cache dir: ~/.cache/omnivoice), written as
    `build_cache.build_once` writes (whole or not at all, one copy when processes race). Within one
    process, build from one thread at a time: model init draws from torch's global RNG.
    """
    return build_once(cache_dir, TINY_VERSION, "config.json", build_tiny_checkpoint)


# Training text for the tiny BPE. Dialogue turns start their own lines on purpose: that is how the
# role names become single tokens ("assistant", not " assistant") as the chat format needs.
