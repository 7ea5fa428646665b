"""The dummy model's tokenizer: the real Qwen3-Omni ids and chat format, built offline and cached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import PreTrainedTokenizerBase, WhisperFeatureExtractor

from omnivoice.models.dummy import ENDOFTEXT_ID, NEWLINE_ID, DummySource, dummy_config, dummy_spec
from omnivoice.models.dummy_tokenizer import (
    ADDED_TOKENS,
    TOKENIZER_VERSION,
    build_dummy_tokenizer,
    ensure_dummy_tokenizer,
    load_dummy_processor_parts,
)
from omnivoice.models.prompt import PromptBuilder
from omnivoice.types import AudioPart, ChatMessage, TextPart

FULL = DummySource("qwen3-omni-30b-a3b")
# The real tokenizer's ids, written out here rather than read from the module under test.
REAL_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
    "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657,
    "<think>": 151667, "</think>": 151668, "<|audio_start|>": 151669, "<|audio_end|>": 151670,
    "<tts_pad>": 151671, "<tts_text_bos>": 151672, "<tts_text_eod>": 151673, "<|audio_pad|>": 151675,
}  # fmt: skip
ROLE_IDS = {"user": 872, "system": 8948, "assistant": 77091, "\n": 198}

Parts = tuple[PreTrainedTokenizerBase, WhisperFeatureExtractor]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Parts:
    """Loaded from the cache folder, as the engine loads them."""
    return load_dummy_processor_parts(tmp_path_factory.mktemp("omnivoice-cache"))


def test_every_added_token_round_trips_at_its_real_id(parts: Parts) -> None:
    tokenizer = parts[0]
    assert len(ADDED_TOKENS) == 33 and len(tokenizer) == 151676  # the real tokenizer's length
    for i, (token, _) in enumerate(ADDED_TOKENS):
        assert REAL_IDS.get(token, 151643 + i) == 151643 + i, token
        assert tokenizer.convert_tokens_to_ids(token) == 151643 + i, token
        assert tokenizer.encode(token, add_special_tokens=False) == [151643 + i], token
        assert tokenizer.decode([151643 + i]) == token
    assert {t for t in REAL_IDS} <= {t for t, _ in ADDED_TOKENS}
    # control tokens inside text are matched whole; the processor reads the audio ones by attribute
    text = "<|im_start|>user\nhi<|audio_start|><|audio_pad|><|audio_end|><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[:3] == [151644, 872, 198] and ids[-4:] == [151669, 151675, 151670, 151645]
    assert tokenizer.decode(ids) == text
    assert (tokenizer.audio_token, tokenizer.audio_bos_token, tokenizer.audio_eos_token) == (
        "<|audio_pad|>", "<|audio_start|>", "<|audio_end|>",
    )  # fmt: skip
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert tokenizer.decode([151644, 872, 151645, 151675], skip_special_tokens=True) == "user"


def test_role_names_and_newline_are_the_real_single_tokens(parts: Parts) -> None:
    tokenizer = parts[0]
    for text, token_id in ROLE_IDS.items():
        assert tokenizer.encode(text, add_special_tokens=False) == [token_id], text
        assert tokenizer.decode([token_id]) == text
    assert NEWLINE_ID == 198 and tokenizer.convert_tokens_to_ids("<|endoftext|>") == ENDOFTEXT_ID
    text = "Hello! Can you hear me? Ünïcödé, 数字 42.\n\n"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_the_configs_ids_are_the_tokenizers(parts: Parts) -> None:
    tid = parts[0].convert_tokens_to_ids
    c = dummy_config(FULL)
    assert dummy_spec(FULL).tool_call_id == tid("<tool_call>") == REAL_IDS["<tool_call>"]
    th: Any = c.thinker_config  # typed loosely by transformers: a config object
    assert (c.im_start_token_id, c.im_end_token_id) == (tid("<|im_start|>"), tid("<|im_end|>"))
    assert (c.tts_pad_token_id, c.tts_bos_token_id, c.tts_eos_token_id) == (
        tid("<tts_pad>"), tid("<tts_text_bos>"), tid("<tts_text_eod>"),
    )  # fmt: skip
    assert (th.audio_token_id, th.audio_start_token_id, th.audio_end_token_id) == (
        tid("<|audio_pad|>"), tid("<|audio_start|>"), tid("<|audio_end|>"),
    )  # fmt: skip
    assert (th.image_token_id, th.video_token_id, th.vision_start_token_id, th.vision_end_token_id) == (
        tid("<|image_pad|>"), tid("<|video_pad|>"), tid("<|vision_start|>"), tid("<|vision_end|>"),
    )  # fmt: skip
    encode = parts[0].encode
    assert [c.system_token_id, c.user_token_id, c.assistant_token_id, th.user_token_id] == [
        *encode("system"), *encode("user"), *encode("assistant"), *encode("user"),
    ]  # fmt: skip
    # every id below the first added one is an ordinary token (random thinker output decodes to text)
    text = parts[0].decode([0, 1000, 151642])
    assert th.text_config.vocab_size >= len(parts[0]) and isinstance(text, str) and text.strip()


def _conversation(pcm: np.ndarray) -> tuple[list[ChatMessage], list[dict[str, Any]]]:
    """The same conversation as engine messages and as chat-template messages."""
    system, question, answer = "You are a voice assistant.", "What did I say?", "You said hello."
    messages = [
        ChatMessage("system", (TextPart(system),)),
        ChatMessage("user", (AudioPart(pcm, 16000), TextPart(question))),
        ChatMessage("assistant", (TextPart(answer),)),
        ChatMessage("user", (TextPart("Thanks!"),)),
    ]
    template: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": question}]},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        {"role": "user", "content": "Thanks!"},
    ]
    return messages, template


def test_chat_template_renders_the_prompt_builders_ids(parts: Parts) -> None:
    """The full-size dummy's prompt builder needs its config only: no weights are built."""
    tokenizer, feature_extractor = parts
    pcm = (0.1 * np.sin(np.linspace(0, 2000, 16000))).astype(np.float32)  # 1 s
    messages, template = _conversation(pcm)
    prompt = PromptBuilder(tokenizer, feature_extractor, dummy_spec(FULL)).build(messages)
    ids = list(prompt.input_ids)
    assert ids[:3] == [151644, 8948, 198] and ids[-3:] == [151644, 77091, 198]
    user = ids.index(872)
    assert ids[user - 1 : user + 3] == [151644, 872, 198, 151669]
    pads = ids.count(151675)
    assert pads == dummy_spec(FULL).audio_token_count(100) and ids[user + 3 + pads] == 151670
    assert len(prompt.audio_features) == 1 and prompt.audio_features[0].shape == (128, 100)
    rendered = tokenizer.apply_chat_template(template, tokenize=False, add_generation_prompt=True)
    expected = tokenizer.encode(rendered, add_special_tokens=False)
    at = expected.index(151675)  # the processor expands the template's one placeholder per audio
    assert expected[:at] + [151675] * pads + expected[at + 1 :] == ids


def test_the_cache_is_built_once_and_holds_the_real_front_end(tmp_path: Path) -> None:
    folder = ensure_dummy_tokenizer(tmp_path)
    assert folder == tmp_path / TOKENIZER_VERSION
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    assert ensure_dummy_tokenizer(tmp_path) == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == [TOKENIZER_VERSION]  # no staging leftovers
    tokenizer, fe = load_dummy_processor_parts(tmp_path)
    built = build_dummy_tokenizer()
    assert tokenizer.get_vocab() == built.get_vocab() and tokenizer.chat_template == built.chat_template
    settings = (fe.feature_size, fe.sampling_rate, fe.hop_length, fe.chunk_length, fe.n_fft)
    assert settings == (128, 16000, 160, 300, 400)
