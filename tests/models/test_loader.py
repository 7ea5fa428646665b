from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3OmniMoeConfig, WhisperFeatureExtractor
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from omnivoice.models.loader import ModelSpec, audio_token_count, load_model, load_processor_parts


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint: Path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model(tiny_checkpoint)
    torch.set_num_threads(threads)


def test_spec_matches_the_tokenizer(loaded, tiny_checkpoint: Path) -> None:
    spec = loaded.spec
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    tid = tokenizer.convert_tokens_to_ids
    assert (spec.im_start_id, spec.im_end_id) == (tid("<|im_start|>"), tid("<|im_end|>"))
    assert (spec.system_id, spec.user_id, spec.assistant_id) == (tid("system"), tid("user"), tid("assistant"))
    assert (spec.audio_start_id, spec.audio_end_id, spec.audio_pad_id) == (
        tid("<|audio_start|>"), tid("<|audio_end|>"), tid("<|audio_pad|>"),
    )  # fmt: skip
    assert (spec.tts_bos_id, spec.tts_eos_id, spec.tts_pad_id) == (
        tid("<|tts_bos|>"), tid("<|tts_eos|>"), tid("<|tts_pad|>"),
    )  # fmt: skip
    assert spec.thinker_eos_ids == (tid("<|im_end|>"), tid("<|endoftext|>"))
    assert spec.tool_call_id == tid("<tool_call>")


def test_spec_reads_codec_side_and_sizes(loaded) -> None:
    spec = loaded.spec
    assert (spec.codec_pad_id, spec.codec_bos_id, spec.codec_eos_id) == (2148, 2149, 2150)
    assert (spec.codec_nothink_id, spec.codec_think_bos_id, spec.codec_think_eos_id) == (2155, 2156, 2157)
    assert dict(spec.speaker_ids) == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    assert (spec.num_code_groups, spec.accept_hidden_layer, spec.talker_vocab_size) == (16, 1, 3072)
    assert (spec.codebook_size, spec.samples_per_frame, spec.frame_rate) == (2048, 1920, 12.5)
    assert (spec.output_sample_rate, spec.input_sample_rate, spec.n_window) == (24000, 16000, 50)
    assert (spec.thinker_vocab_size, spec.thinker_hidden_size, spec.talker_hidden_size) == (1024, 64, 64)


def test_talker_suppressed_ids_mirror_generate(loaded) -> None:
    suppressed = loaded.spec.talker_suppressed_ids
    assert suppressed == tuple(i for i in range(2048, 3072) if i != 2150)


def test_speaker_lookup_is_case_insensitive(loaded) -> None:
    assert loaded.spec.speaker_id("Ethan") == 2302
    with pytest.raises(ValueError, match="chelsie"):
        loaded.spec.speaker_id("nobody")


def test_spec_reads_a_real_layout_config() -> None:
    """The real checkpoint's numbers come out of its config layout, with nothing hard-coded."""
    config = Qwen3OmniMoeConfig(
        thinker_config={
            "audio_token_id": 151675, "audio_start_token_id": 151669, "audio_end_token_id": 151670,
            "text_config": {"vocab_size": 152064, "hidden_size": 2048, "num_hidden_layers": 48},
            "audio_config": {"n_window": 50, "num_mel_bins": 128, "output_dim": 2048},
        },
        talker_config={
            "accept_hidden_layer": 24, "num_code_groups": 16, "thinker_hidden_size": 2048,
            "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
            "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
            "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
            "text_config": {"vocab_size": 3072, "hidden_size": 1024},
            "code_predictor_config": {"vocab_size": 2048, "num_code_groups": 16},
        },
        code2wav_config={"codebook_size": 2048, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2]},
        im_start_token_id=151644, im_end_token_id=151645, system_token_id=8948, user_token_id=872,
        assistant_token_id=77091, tts_pad_token_id=151671, tts_bos_token_id=151672, tts_eos_token_id=151673,
    )  # fmt: skip
    spec = ModelSpec.from_config(config, endoftext_id=151643)
    assert (spec.im_start_id, spec.user_id, spec.assistant_id, spec.system_id) == (151644, 872, 77091, 8948)
    assert (spec.audio_start_id, spec.audio_end_id, spec.audio_pad_id) == (151669, 151670, 151675)
    assert (spec.tts_pad_id, spec.tts_bos_id, spec.tts_eos_id) == (151671, 151672, 151673)
    assert spec.thinker_eos_ids == (151645, 151643)
    assert (spec.accept_hidden_layer, spec.thinker_hidden_size, spec.talker_hidden_size) == (24, 2048, 1024)
    assert spec.samples_per_frame == 1920
    assert ModelSpec.from_config(config).thinker_eos_ids == (151645,)


def test_load_model_is_eval_and_frozen(loaded, tiny_checkpoint: Path) -> None:
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.dtype == torch.float32 and loaded.model.dtype == torch.float32
    assert loaded.device == torch.device("cpu") and loaded.path == tiny_checkpoint
    assert loaded.spec == ModelSpec.from_pretrained(tiny_checkpoint)


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_processor_parts(tmp_path / "nowhere")


def test_processor_parts(tiny_checkpoint: Path) -> None:
    tokenizer, feature_extractor = load_processor_parts(tiny_checkpoint)
    assert len(tokenizer) == 1024
    assert isinstance(feature_extractor, WhisperFeatureExtractor)
    assert feature_extractor.feature_size == 128


@pytest.mark.parametrize("frames", [1, 2, 37, 99, 100, 101, 199, 250, 1000])
def test_audio_token_count_matches_the_audio_encoder(loaded, frames: int) -> None:
    assert audio_token_count(frames, 50) == int(_get_feat_extract_output_lengths(torch.tensor(frames), 50))
    features = torch.randn(1, 128, frames, generator=torch.Generator().manual_seed(frames))
    mask = torch.ones(1, frames, dtype=torch.long)
    with torch.no_grad():
        out = loaded.model.thinker.get_audio_features(features, feature_attention_mask=mask)
    assert out.last_hidden_state.shape == (loaded.spec.audio_token_count(frames), 64)


def test_loader_imports_without_server_dependencies() -> None:
    code = (
        "import sys, omnivoice.models.loader, omnivoice.models.prompt\n"
        "heavy = [m for m in ('starlette', 'uvicorn', 'omnivoice.server') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
