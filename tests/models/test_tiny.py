from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

from omnivoice.models.chat_template import qwen3_omni_chat_template
from omnivoice.models.tiny import (
    SPECIAL_TOKENS,
    TEXT_VOCAB_SIZE,
    TINY_VERSION,
    build_tiny_checkpoint,
    build_tiny_model,
    ensure_tiny_checkpoint,
)

CHECKPOINT_FILES = (
    "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json",
)  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_checkpoint_layout_and_size(tiny_checkpoint: Path) -> None:
    assert tiny_checkpoint.name == TINY_VERSION
    for name in CHECKPOINT_FILES:
        assert (tiny_checkpoint / name).is_file(), name
    assert (tiny_checkpoint / "model.safetensors").stat().st_size < 40e6


def test_roundtrip_through_save_and_from_pretrained_is_exact(tiny_checkpoint: Path) -> None:
    built, _ = build_tiny_model(seed=0)
    loaded = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        tiny_checkpoint, dtype=torch.float32, local_files_only=True
    )
    expected, actual = built.state_dict(), loaded.state_dict()
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), name


def test_build_is_deterministic(tiny_checkpoint: Path, tmp_path: Path) -> None:
    build_tiny_checkpoint(tmp_path / "again", seed=0)
    build_tiny_checkpoint(tmp_path / "other", seed=1)
    for name in CHECKPOINT_FILES:
        again = (tmp_path / "again" / name).read_bytes()
        assert again == (tiny_checkpoint / name).read_bytes(), f"{name} differs: bump TINY_VERSION?"
    other = (tmp_path / "other" / "model.safetensors").read_bytes()
    assert other != (tiny_checkpoint / "model.safetensors").read_bytes()


def test_config_has_the_tiny_shapes_and_real_ids(tiny_checkpoint: Path) -> None:
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint, local_files_only=True)
    config = model.config
    text = config.thinker_config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (64, 2, TEXT_VOCAB_SIZE)
    assert (text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (4, 2, 16)
    assert (text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size) == (4, 2, 32)
    assert sum(text.rope_parameters["mrope_section"]) == text.head_dim // 2
    audio = config.thinker_config.audio_config
    assert (audio.d_model, audio.encoder_layers, audio.output_dim, audio.num_mel_bins) == (32, 2, 64, 128)
    assert audio.n_window_infer // (2 * audio.n_window) == 8  # the real 800 / (2 * 50)
    talker = config.talker_config
    assert talker.accept_hidden_layer < text.num_hidden_layers
    assert talker.text_config.vocab_size == talker.code_predictor_config.vocab_size + 1024
    assert talker.num_code_groups == talker.code_predictor_config.num_code_groups == 16
    assert (talker.codec_pad_id, talker.codec_bos_id, talker.codec_eos_token_id) == (2148, 2149, 2150)
    assert talker.speaker_id == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    assert int(model.code2wav.total_upsample) == 1920
    top = range(TEXT_VOCAB_SIZE - len(SPECIAL_TOKENS), TEXT_VOCAB_SIZE)
    for token_id in (
        config.im_start_token_id,
        config.im_end_token_id,
        config.tts_bos_token_id,
        config.thinker_config.audio_token_id,
        config.thinker_config.audio_start_token_id,
    ):
        assert token_id in top  # fmt: skip
    assert 5e6 < sum(p.numel() for p in model.parameters()) < 8e6  # ~7.1M: 28 MB in fp32


def test_tokenizer_reloads_offline(tiny_checkpoint: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    assert len(tokenizer) == TEXT_VOCAB_SIZE
    for token in SPECIAL_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] >= TEXT_VOCAB_SIZE - len(SPECIAL_TOKENS), token
    for role in ("system", "user", "assistant"):
        assert len(tokenizer.encode(role, add_special_tokens=False)) == 1
    text = "Hello! Can you hear me? The weather is sunny, 21 degrees. Ünïcödé too."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.audio_token == "<|audio_pad|>"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.chat_template == qwen3_omni_chat_template()  # the real template, tools included
    # the tool and think tags are plain added tokens, as in the real vocabulary: kept when decoding
    ids = tokenizer.encode("<tool_call>\n{}\n</tool_call><think></think>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call><think></think>"


def test_feature_extractor_is_the_real_front_end(tiny_checkpoint: Path) -> None:
    fe = WhisperFeatureExtractor.from_pretrained(tiny_checkpoint, local_files_only=True)
    assert (fe.feature_size, fe.sampling_rate, fe.hop_length, fe.n_fft, fe.chunk_length) == (
        128, 16000, 160, 400, 300,
    )  # fmt: skip


def test_random_codes_decode_to_audible_audio() -> None:
    model, _ = build_tiny_model(seed=0)
    codes = torch.randint(0, 2048, (1, 16, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        wav = model.code2wav(codes)
    # Like the real vocoder: 1920 samples per frame, less 555 the causal transposed convs trim per decode.
    assert wav.shape[-1] == 12 * 1920 - 555
    assert 0.1 < wav.abs().max().item() < 0.6


def test_ensure_returns_the_cached_build(tiny_checkpoint: Path) -> None:
    before = (tiny_checkpoint / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_checkpoint(tiny_checkpoint.parent) == tiny_checkpoint
    assert (tiny_checkpoint / "model.safetensors").stat().st_mtime_ns == before


def test_concurrent_builders_leave_one_complete_copy(tiny_checkpoint: Path, tmp_path: Path) -> None:
    script = "import sys; from omnivoice.models.tiny import ensure_tiny_checkpoint; "
    script += "print(ensure_tiny_checkpoint(sys.argv[1]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=120)[0].strip() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert outputs == [str(tmp_path / TINY_VERSION)] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [TINY_VERSION]  # no staging leftovers
    built = (tmp_path / TINY_VERSION / "model.safetensors").read_bytes()
    assert built == (tiny_checkpoint / "model.safetensors").read_bytes()
