"""The `dummy:` model source: full-size config values, and the build path at a reduced size on the CPU."""

from __future__ import annotations

import pytest
import torch

from omnivoice.config import ProfileError, parse_profile
from omnivoice.models.dummy import (
    PARTS,
    REDUCED,
    DummySource,
    build_dummy_model,
    build_dummy_part,
    dummy_config,
    dummy_spec,
    dummy_tts_embeds,
)
from omnivoice.models.dummy_source import parse_source

FULL = DummySource("qwen3-omni-30b-a3b")


def test_full_config_is_the_public_checkpoint() -> None:
    c = dummy_config(FULL)
    th, tk, cw = c.thinker_config, c.talker_config, c.code2wav_config
    t = th.text_config
    assert (t.num_hidden_layers, t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (
        48, 2048, 32, 4, 128,
    )  # fmt: skip
    assert (t.num_experts, t.num_experts_per_tok, t.moe_intermediate_size) == (128, 8, 768)
    assert t.vocab_size == 152064
    assert (th.audio_config.d_model, th.audio_config.encoder_layers) == (1280, 32)
    k = tk.text_config
    assert (k.num_hidden_layers, k.hidden_size, k.num_attention_heads, k.num_key_value_heads) == (
        20, 1024, 16, 2,
    )  # fmt: skip
    assert (k.num_experts, k.num_experts_per_tok, k.shared_expert_intermediate_size, k.vocab_size) == (
        128, 6, 768, 3072,
    )  # fmt: skip
    p = tk.code_predictor_config
    assert (p.num_hidden_layers, p.hidden_size, p.num_attention_heads, p.num_key_value_heads) == (
        5,
        1024,
        16,
        8,
    )
    assert p.vocab_size == 2048
    assert tk.accept_hidden_layer == 24 and tk.speaker_id == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    assert (cw.num_hidden_layers, cw.sliding_window, cw.upsample_rates, cw.upsampling_ratios) == (
        8, 72, [8, 5, 4, 3], [2, 2],
    )  # fmt: skip
    assert (c.im_start_token_id, c.im_end_token_id, c.tts_pad_token_id, c.tts_bos_token_id) == (
        151644, 151645, 151671, 151672,
    )  # fmt: skip
    with torch.device("meta"):  # no memory: count the parameters of the real architecture
        from transformers import Qwen3OmniMoeForConditionalGeneration

        model = Qwen3OmniMoeForConditionalGeneration(c)
    total = sum(p.numel() for p in model.parameters())
    assert 35.0e9 < total < 35.5e9  # the checkpoint holds 35.3B
    assert 0.2e9 < sum(p.numel() for p in model.code2wav.parameters()) < 0.23e9


def test_reduced_parts_are_seeded_finite_and_init_the_talker_experts() -> None:
    source = DummySource(FULL.name, overrides=REDUCED)
    parts = {p: build_dummy_part(source, p, "cpu", torch.float32) for p in PARTS}
    for name, model in parts.items():
        again = build_dummy_part(source, name, "cpu", torch.float32)  # alone: the same weights
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
        assert all(torch.isfinite(p).all() for p in model.parameters())
        assert not model.training and not any(p.requires_grad for p in model.parameters())
    moe = parts["talker"].model.layers[0].mlp
    for w in (moe.experts.gate_up_proj, moe.experts.down_proj, moe.gate.weight):
        assert 0.015 < float(w.std()) < 0.025  # initialised, not torch.empty / zeros
    spec = dummy_spec(source)
    assert spec.thinker_eos_ids == (151645, 151643) and spec.codec_eos_id == 2150
    assert spec.speaker_id("Ethan") == 2302 and spec.samples_per_frame == 1920
    # the talker's workers read the thinker's TTS embeddings without building the thinker
    table = parts["thinker"].get_input_embeddings().weight
    tts = dummy_tts_embeds(source, "cpu", torch.float32)
    assert torch.equal(tts, table[[spec.tts_bos_id, spec.tts_eos_id, spec.tts_pad_id]])
    reseeded = DummySource(FULL.name, seed=1, overrides=REDUCED)
    other = build_dummy_part(reseeded, "talker", "cpu", torch.float32)
    assert not torch.equal(other.codec_head.weight, parts["talker"].codec_head.weight)


def test_profile_validates_dummy_names() -> None:
    path = "dummy:qwen3-omni-30b-a3b"
    assert parse_profile({"model": {"path": path}}).model.path == path
    with pytest.raises(ProfileError, match=r"model\.path: .*unknown dummy model 'gpt'"):
        parse_profile({"model": {"path": "dummy:gpt"}})
    assert parse_source("dummy:qwen3-omni-30b-a3b") == FULL
    assert parse_source("/models/Qwen3-Omni-30B-A3B-Instruct") is None


def test_the_whole_model_is_made_of_the_parts() -> None:
    source = DummySource(FULL.name, overrides=REDUCED)
    model, _ = build_dummy_model(source, "cpu", torch.float32)  # transformers' generate() runs on it
    assert not any(p.is_meta for p in model.parameters())
    talker = build_dummy_part(source, "talker", "cpu", torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(model.talker.parameters(), talker.parameters(), strict=True))
