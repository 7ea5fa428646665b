"""The `dummy:` model's tokenizer: Qwen3-Omni's vocabulary layout, built from code, never downloaded.

A random-weight model needs no real vocabulary, but the engine and server need one laid out like the
real one: every control token at its real id (<|im_start|> 151644, <|audio_pad|> 151675, ...), the role
names and the newline as the single tokens the chat format places (user 872, system 8948, assistant
77091, "\\n" 198), and 151,643 ordinary tokens below the first control token, so prompts, token-id
loads and stop tokens match the real checkpoint's. The vocabulary is built explicitly:

- ids 0-255: the 256 byte-level symbols in GPT-2's order (the real order: "\\n" lands on 198);
- then the merges a small byte-level BPE learns from the built-in corpus (the tiny model's), with the
  role names moved to their real ids;
- then filler pseudo-words (" ab", " ac", ...) up to 151,642: no merge makes them, so text never
  encodes to them, but a random model's output decodes to readable gibberish;
- then Qwen3-Omni's 33 added tokens, in its order, from 151,643 (<|endoftext|>) to 151,675.

It is saved with Whisper's log-mel settings (the real processor's) into a versioned folder of the
cache dir and loaded from there like a checkpoint's tokenizer and feature extractor.
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

from tokenizers import AddedToken
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Tokenizer, WhisperFeatureExtractor

from omnivoice.models.build_cache import build_once
from omnivoice.models.chat_template import qwen3_omni_chat_template
from omnivoice.models.tiny import EXTRA_SPECIAL_TOKENS, tiny_feature_extractor, train_corpus_bpe

TOKENIZER_VERSION = "dummy-tokenizer-v2"  # bump whenever the recipe below changes: the cache is keyed by it
FIRST_ADDED_ID = 151643
# Qwen3-Omni's added tokens in id order from FIRST_ADDED_ID, each with whether it is special (control
# tokens, skipped when decoding with skip_special_tokens) or a plain added token (tool and think tags).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
)  # fmt: skip
# Words the chat format writes after <|im_start|>, at their ids in the real vocabulary.
ROLE_IDS: Mapping[str, int] = MappingProxyType({"user": 872, "system": 8948, "assistant": 77091})
LEARNED_MERGES = 768  # merges learned from the corpus: enough for every role name to be one token


def added_token_id(token: str) -> int:
    """The id of one of Qwen3-Omni's added tokens (KeyError for another string)."""
    for i, (added, _) in enumerate(ADDED_TOKENS):
        if added == token:
            return FIRST_ADDED_ID + i
    raise KeyError(f"{token!r} is not one of the added tokens")


def byte_symbols() -> list[str]:
    """The 256 byte-level symbols in GPT-2's order (printable bytes first), so symbol i has id i."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    rest = [b for b in range(256) if b not in printable]  # spelled chr(256 + k), as ByteLevel does
    return [chr(b) for b in printable] + [chr(256 + k) for k in range(len(rest))]


def _fillers() -> Iterator[str]:
    """Pseudo-words: "Ġ" (byte-level's space) then two letters, then three, ...: " aa", " ab", ..."""
    for length in itertools.count(2):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            yield "Ġ" + "".join(letters)


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    bpe = train_corpus_bpe(256 + LEARNED_MERGES)
    merges = [(a, b) for a, b in json.loads(bpe.to_str())["model"]["merges"]]
    vocab = {symbol: i for i, symbol in enumerate(byte_symbols())}
    pinned = set(ROLE_IDS.values())
    free = (i for i in range(len(vocab), FIRST_ADDED_ID) if i not in pinned)
    for left, right in merges:
        token = left + right
        vocab[token] = ROLE_IDS[token] if token in ROLE_IDS else next(free)
    fillers = (token for token in _fillers() if token not in vocab)
    vocab.update(zip(fillers, free, strict=False))
    vocab.update({token: FIRST_ADDED_ID + i for i, (token, _) in enumerate(ADDED_TOKENS)})
    return vocab, merges


def build_dummy_tokenizer() -> Qwen2Tokenizer:
    """Build the tokenizer (in memory, offline); RuntimeError if an id is not where the real one is."""
    vocab, merges = _vocab_and_merges()
    # transformers annotates `merges` and `unk_token` as strings; tokenizers' BPE takes pairs and None
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,  # type: ignore[arg-type]
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,  # type: ignore[arg-type]
        extra_special_tokens=dict(EXTRA_SPECIAL_TOKENS),
        model_max_length=32768,
    )
    # Added tokens are matched whole before BPE (never split); special ones are skipped in decoding.
    tokenizer.add_special_tokens({"extra_special_tokens": [t for t, special in ADDED_TOKENS[1:] if special]})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, s in ADDED_TOKENS if not s])
    tokenizer.chat_template = qwen3_omni_chat_template()
    _check(tokenizer)
    return tokenizer


def _check(tokenizer: PreTrainedTokenizerBase) -> None:
    expected = {token: FIRST_ADDED_ID + i for i, (token, _) in enumerate(ADDED_TOKENS)}
    for token, token_id in expected.items():
        if tokenizer.convert_tokens_to_ids(token) != token_id:
            raise RuntimeError(f"{token} landed on {tokenizer.convert_tokens_to_ids(token)}, not {token_id}")
    for text, token_id in {**ROLE_IDS, "\n": 198}.items():
        if tokenizer.encode(text, add_special_tokens=False) != [token_id]:
            raise RuntimeError(f"{text!r} does not encode to [{token_id}]; grow the corpus")
    if len(tokenizer) != FIRST_ADDED_ID + len(ADDED_TOKENS):
        raise RuntimeError(f"the vocabulary holds {len(tokenizer)} tokens")


def _write(folder: Path) -> None:
    build_dummy_tokenizer().save_pretrained(folder)
    tiny_feature_extractor().save_pretrained(folder)


def ensure_dummy_tokenizer(cache_dir: Path | str | None = None) -> Path:
    """The folder holding the dummy's tokenizer and feature extractor, built on first use.

    `<cache_dir>/dummy-tokenizer-v2` (default cache dir: ~/.cache/omnivoice), written whole or not at
    all (see `build_cache.build_once`).
    """
    return build_once(cache_dir, TOKENIZER_VERSION, "preprocessor_config.json", _write)


def load_dummy_processor_parts(
    cache_dir: Path | str | None = None,
) -> tuple[PreTrainedTokenizerBase, WhisperFeatureExtractor]:
    """The dummy's tokenizer and log-mel feature extractor, read as a checkpoint's are (loader.py)."""
    folder = ensure_dummy_tokenizer(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    feature_extractor = WhisperFeatureExtractor.from_pretrained(folder, local_files_only=True)
    return tokenizer, feature_extractor
