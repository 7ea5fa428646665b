"""Turn chat messages (text and audio) into a thinker `Prompt`: token ids plus one log-mel matrix per audio.

The layout is Qwen's chat format, as the checkpoint's chat template and Qwen3OmniMoeProcessor build it:

    <|im_start|>system\\n{text}<|im_end|>\\n
    <|im_start|>user\\n<|audio_start|><|audio_pad|>*N<|audio_end|>{text}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<|im_end|>\\n
    <|im_start|>assistant\\n                       <- generation prompt

Each run of text between control tokens is encoded on its own, which is exactly what the tokenizer does
to the rendered string (added tokens split the input before BPE). One difference on purpose: control
token strings typed inside message text (e.g. "<|im_end|>") are encoded as plain text, not as control
tokens, so a user cannot forge turns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase, WhisperFeatureExtractor

from omnivoice.models.loader import ModelSpec
from omnivoice.types import AudioPart, ChatMessage, Prompt, TextPart

ROLES = ("system", "user", "assistant")


class PromptError(ValueError):
    """The messages cannot be turned into a prompt (empty, unknown role, bad or too long audio...)."""


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class PromptBuilder:
    """Builds thinker prompts in the checkpoint's chat format; one instance per loaded checkpoint."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        feature_extractor: WhisperFeatureExtractor,
        spec: ModelSpec,
        max_audio_seconds: float = 300.0,
    ) -> None:
        if feature_extractor.sampling_rate != spec.input_sample_rate:
            raise ValueError(
                f"feature extractor runs at {feature_extractor.sampling_rate} Hz, "
                f"the audio encoder expects {spec.input_sample_rate} Hz"
            )
        if feature_extractor.feature_size != spec.num_mel_bins:
            raise ValueError(
                f"feature extractor makes {feature_extractor.feature_size} mel bins, "
                f"the audio encoder expects {spec.num_mel_bins}"
            )
        self._tokenizer = tokenizer
        self._feature_extractor = feature_extractor
        self._spec = spec
        self._max_audio_seconds = max_audio_seconds
        self._role_ids = {"system": spec.system_id, "user": spec.user_id, "assistant": spec.assistant_id}
        # The most characters of text one token stands for. Byte-level BPE spells each byte of a token
        # as one character, and a character is at least a byte, so no token covers more characters than
        # its entry in the vocabulary has; control tokens are left out (never read from message text).
        vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
        self.max_token_chars = max(map(len, vocab))

    def build(self, messages: Sequence[ChatMessage], default_system: str | None = None) -> Prompt:
        """Tokenize `messages` and end with the assistant generation prompt.

        `default_system` is prepended as a system turn when the first message is not one.
        Raises PromptError on invalid input.
        """
        if not messages:
            raise PromptError("no messages to build a prompt from")
        if default_system is not None and messages[0].role != "system":
            messages = [ChatMessage(role="system", parts=(TextPart(default_system),)), *messages]
        pieces: list[str | int] = []  # text to encode, or an already-known token id
        features: list[np.ndarray] = []
        for index, message in enumerate(messages):
            self._check_message(index, message)
            pieces += [self._spec.im_start_id, self._role_ids[message.role], "\n"]
            for part in message.parts:
                if isinstance(part, TextPart):
                    pieces.append(part.text)
                else:
                    mel = self._log_mel(index, part)  # [n_mels, frames]
                    features.append(mel)
                    count = self._spec.audio_token_count(mel.shape[1])
                    pieces += [self._spec.audio_start_id, *[self._spec.audio_pad_id] * count]
                    pieces.append(self._spec.audio_end_id)
            pieces += [self._spec.im_end_id, "\n"]
        pieces += [self._spec.im_start_id, self._spec.assistant_id, "\n"]
        return Prompt(input_ids=tuple(self._encode(pieces)), audio_features=tuple(features))

    def _check_message(self, index: int, message: ChatMessage) -> None:
        if message.role not in ROLES:
            raise PromptError(f"message {index}: unsupported role {message.role!r}; use one of {ROLES}")
        if not message.parts:
            raise PromptError(f"message {index} ({message.role}) has no content")
        for part in message.parts:
            if isinstance(part, AudioPart):
                if message.role != "user":
                    # Assistant turns are replayed as their text transcript; system turns are text only.
                    raise PromptError(f"message {index}: audio is only accepted in user messages")
            elif not isinstance(part, TextPart):
                raise PromptError(f"message {index}: unsupported content part {type(part).__name__}")
            elif not _is_unicode(part.text):  # JSON's "\ud800" decodes to one; the tokenizer raises on it
                raise PromptError(f"message {index}: the text is not valid Unicode (a lone surrogate)")

    def _encode(self, pieces: list[str | int]) -> list[int]:
        """Encode each maximal run of text pieces as one string; ids pass through."""
        ids: list[int] = []
        run: list[str] = []
        for piece in [*pieces, None]:
            if isinstance(piece, str):
                run.append(piece)
                continue
            if run:
                text = "".join(run)
                ids += self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
                run = []
            if piece is not None:
                ids.append(piece)
        return ids

    def _log_mel(self, index: int, part: AudioPart) -> np.ndarray:
        """Log-mel features [n_mels, frames] float32, trimmed to the audio's real length.

        Each audio is featurized on its own, as the processor does for a single clip: the feature
        extractor pads a batch to its longest clip, which would change the last frames of shorter
        clips (and so a clip's features would depend on the other clips in the conversation).
        """
        pcm = np.asarray(part.pcm, dtype=np.float32)
        if pcm.ndim != 1:
            raise PromptError(f"message {index}: audio must be mono 1-D PCM, got shape {pcm.shape}")
        if part.sample_rate <= 0:
            raise PromptError(f"message {index}: invalid audio sample rate {part.sample_rate}")
        if pcm.size == 0:
            raise PromptError(f"message {index}: audio is empty")
        seconds = pcm.size / part.sample_rate
        if seconds > self._max_audio_seconds:
            raise PromptError(
                f"message {index}: audio is {seconds:.1f} s long; the limit is {self._max_audio_seconds:g} s"
            )
        if not np.isfinite(pcm).all():
            raise PromptError(f"message {index}: audio contains NaN or infinite samples")
        rate = self._spec.input_sample_rate
        if part.sample_rate != rate:
            import soxr  # lazily: the GPU image has no soxr, and token-id prompts never resample

            pcm = soxr.resample(pcm, part.sample_rate, rate).astype(np.float32, copy=False)
        if pcm.size < self._feature_extractor.hop_length:
            raise PromptError(f"message {index}: audio is shorter than one feature frame ({seconds:.4f} s)")
        out = self._feature_extractor(
            pcm,
            sampling_rate=rate,
            padding="longest",  # the default pads every clip to 300 s
            truncation=False,
            return_attention_mask=True,
            return_tensors="np",
        )
        frames = int(out["attention_mask"][0].sum())
        return np.ascontiguousarray(out["input_features"][0, :, :frames], dtype=np.float32)


def audio_inputs(prompt: Prompt) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The prompt's audio as Qwen3OmniMoeProcessor hands it to the model, or None without audio.

    Returns input_features [num_audios, n_mels, max_frames] float32 (zero-padded on the right) and
    feature_attention_mask [num_audios, max_frames] int64 (1 on real frames).
    """
    if not prompt.audio_features:
        return None
    lengths = [mel.shape[1] for mel in prompt.audio_features]
    n_mels = prompt.audio_features[0].shape[0]
    features = torch.zeros(len(lengths), n_mels, max(lengths), dtype=torch.float32)
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, mel in enumerate(prompt.audio_features):
        features[row, :, : mel.shape[1]] = torch.from_numpy(mel)
        mask[row, : mel.shape[1]] = 1
    return features, mask
