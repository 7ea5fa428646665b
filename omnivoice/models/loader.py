"""Load a Qwen3-Omni checkpoint (Hugging Face layout, local folder) and describe it with a `ModelSpec`.

Works the same for the real Qwen3-Omni-30B-A3B-Instruct folder and the tiny test checkpoint: every
id and size the engine needs is read from the checkpoint, never hard-coded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from omnivoice.models.image_processor import ImageSettings

# Code2Wav writes 24 kHz audio and the audio encoder reads 16 kHz log-mels; neither rate is recorded in
# config.json (the input rate is in preprocessor_config.json, which PromptBuilder checks against this).
OUTPUT_SAMPLE_RATE = 24000
INPUT_SAMPLE_RATE = 16000
# transformers' generate() suppresses the top 1024 talker ids (codec control tokens) except codec eos.
TALKER_SPECIAL_SPAN = 1024
ENDOFTEXT_TOKEN = "<|endoftext|>"
TOOL_CALL_TOKEN = "<tool_call>"  # opens a function call in the thinker's text (Hermes form)


def audio_token_count(num_mel_frames: int, n_window: int) -> int:
    """Audio placeholder tokens the thinker expects for `num_mel_frames` log-mel frames (unpadded).

    Calls transformers' own `_get_feat_extract_output_lengths`, which the processor and the audio encoder
    use, so the count always matches the model.
    """
    return int(_get_feat_extract_output_lengths(num_mel_frames, n_window))


@dataclass(frozen=True)
class ModelSpec:
    """The ids and sizes of one Qwen3-Omni checkpoint that the engine needs, read from its config."""

    # chat format (thinker text vocab)
    im_start_id: int
    im_end_id: int
    system_id: int
    user_id: int
    assistant_id: int
    audio_start_id: int
    audio_end_id: int
    audio_pad_id: int
    tts_bos_id: int
    tts_eos_id: int
    tts_pad_id: int
    thinker_eos_ids: tuple[int, ...]  # im_end first, then endoftext when known
    # talker codec vocab
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    speaker_ids: Mapping[str, int] = field(hash=False)
    # sizes
    num_code_groups: int
    accept_hidden_layer: int  # index into the thinker's hidden states: 0 = embeddings, k = after layer k
    thinker_vocab_size: int
    thinker_hidden_size: int
    talker_hidden_size: int
    talker_vocab_size: int
    codebook_size: int
    samples_per_frame: int
    n_window: int
    n_window_infer: int  # log-mel frames the audio encoder attends over at once
    num_mel_bins: int
    output_sample_rate: int = OUTPUT_SAMPLE_RATE
    input_sample_rate: int = INPUT_SAMPLE_RATE
    # `<tool_call>`, the token that opens a function call: in a request that offers functions the
    # talker gets no text from it on (None: the vocabulary has no such token)
    tool_call_id: int | None = None
    # images: `<|image_pad|>` and the ids around its run (None: the checkpoint has no vision tower)
    image_pad_id: int | None = None
    vision_start_id: int | None = None
    vision_end_id: int | None = None

    @classmethod
    def from_config(
        cls, config: Qwen3OmniMoeConfig, endoftext_id: int | None = None, tool_call_id: int | None = None
    ) -> ModelSpec:
        """Read the spec from a checkpoint config.

        `endoftext_id` (the tokenizer's `<|endoftext|>`, not recorded in config.json) joins `<|im_end|>`
        as a thinker stop token when given; `tool_call_id` is the tokenizer's `<tool_call>`, likewise
        not in config.json. `from_pretrained` looks both up.
        """
        thinker = _sub_config(config, "thinker_config")
        talker = _sub_config(config, "talker_config")
        code2wav = _sub_config(config, "code2wav_config")
        return cls(
            im_start_id=config.im_start_token_id,
            im_end_id=config.im_end_token_id,
            system_id=config.system_token_id,
            user_id=config.user_token_id,
            assistant_id=config.assistant_token_id,
            audio_start_id=thinker.audio_start_token_id,
            audio_end_id=thinker.audio_end_token_id,
            audio_pad_id=thinker.audio_token_id,
            tts_bos_id=config.tts_bos_token_id,
            tts_eos_id=config.tts_eos_token_id,
            tts_pad_id=config.tts_pad_token_id,
            thinker_eos_ids=(config.im_end_token_id,) + (() if endoftext_id is None else (endoftext_id,)),
            codec_pad_id=talker.codec_pad_id,
            codec_bos_id=talker.codec_bos_id,
            codec_eos_id=talker.codec_eos_token_id,
            codec_nothink_id=talker.codec_nothink_id,
            codec_think_bos_id=talker.codec_think_bos_id,
            codec_think_eos_id=talker.codec_think_eos_id,
            speaker_ids=MappingProxyType({k.lower(): v for k, v in talker.speaker_id.items()}),
            num_code_groups=talker.num_code_groups,
            accept_hidden_layer=talker.accept_hidden_layer,
            thinker_vocab_size=thinker.text_config.vocab_size,
            thinker_hidden_size=thinker.text_config.hidden_size,
            talker_hidden_size=talker.text_config.hidden_size,
            talker_vocab_size=talker.text_config.vocab_size,
            codebook_size=code2wav.codebook_size,
            samples_per_frame=math.prod(code2wav.upsample_rates) * math.prod(code2wav.upsampling_ratios),
            n_window=thinker.audio_config.n_window,
            n_window_infer=thinker.audio_config.n_window_infer,
            num_mel_bins=thinker.audio_config.num_mel_bins,
            tool_call_id=tool_call_id,
            image_pad_id=getattr(thinker, "image_token_id", None),
            vision_start_id=getattr(thinker, "vision_start_token_id", None),
            vision_end_id=getattr(thinker, "vision_end_token_id", None),
        )

    @classmethod
    def from_pretrained(cls, path: Path | str) -> ModelSpec:
        """Read the spec from a checkpoint folder: config.json plus the tokenizer's `<|endoftext|>` and
        `<tool_call>` ids."""
        config = Qwen3OmniMoeConfig.from_pretrained(path, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        endoftext, tool_call = _token_id(tokenizer, ENDOFTEXT_TOKEN), _token_id(tokenizer, TOOL_CALL_TOKEN)
        return cls.from_config(config, endoftext_id=endoftext, tool_call_id=tool_call)

    @property
    def talker_suppressed_ids(self) -> tuple[int, ...]:
        """Ids the talker never samples: codec control ids except codec eos (as generate() does)."""
        span = range(self.talker_vocab_size - TALKER_SPECIAL_SPAN, self.talker_vocab_size)
        return tuple(i for i in span if i != self.codec_eos_id)

    @property
    def frame_rate(self) -> float:
        """Codec frames per second of output audio (12.5 for Qwen3-Omni)."""
        return self.output_sample_rate / self.samples_per_frame

    def speaker_id(self, voice: str) -> int:
        """The codec id of a voice name (case-insensitive); ValueError names the known voices."""
        try:
            return self.speaker_ids[voice.lower()]
        except KeyError:
            raise ValueError(f"unknown voice {voice!r}; known: {sorted(self.speaker_ids)}") from None

    @property
    def audio_window_frames(self) -> int:
        """Log-mel frames of one attention window of the audio encoder (whole chunks of 2 * n_window):
        the encoder's output for a window depends on that window's frames only."""
        chunk = 2 * self.n_window
        return max(1, self.n_window_infer // chunk) * chunk

    def audio_token_count(self, num_mel_frames: int) -> int:
        """Audio placeholder tokens for `num_mel_frames` unpadded log-mel frames."""
        return audio_token_count(num_mel_frames, self.n_window)


@dataclass(frozen=True)
class LoadedModel:
    """A loaded checkpoint: the transformers model (eval mode, no grad) and its spec."""

    model: Qwen3OmniMoeForConditionalGeneration
    spec: ModelSpec
    path: Path
    device: torch.device
    dtype: torch.dtype


def _sub_config(config: Qwen3OmniMoeConfig, name: str) -> Any:
    """One of `config`'s sub-configs. transformers types them as `dict | PreTrainedConfig | None`, but
    its constructor makes config objects of them (with attributes that vary by model): `Any`."""
    sub = getattr(config, name)
    if sub is None or isinstance(sub, dict):
        raise ValueError(f"checkpoint config: {name} is not a config object ({type(sub).__name__})")
    return sub


def _checkpoint_dir(path: Path | str) -> Path:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no Qwen3-Omni checkpoint at {path} (config.json missing)")
    return path


def _token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int | None:
    """The id of `token` as one whole token of the vocabulary, else None."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    return token_id if isinstance(token_id, int) and token_id != tokenizer.unk_token_id else None


def load_model(path: Path | str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a Qwen3-Omni checkpoint from a local folder onto `device`, in eval mode with grads off.

    Off the CPU the weights stream straight to the device (`device_map`, which needs `accelerate`),
    so the 66 GB real checkpoint is never staged in host memory first.
    """
    path = _checkpoint_dir(path)
    placement: dict[str, Any] = {} if torch.device(device).type == "cpu" else {"device_map": device}
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        path, dtype=dtype, local_files_only=True, **placement
    )
    model.eval().requires_grad_(False)
    spec = ModelSpec.from_pretrained(path)
    return LoadedModel(model=model, spec=spec, path=path, device=torch.device(device), dtype=dtype)


def load_image_settings(path: Path | str) -> ImageSettings:
    """How the checkpoint's image processor turns images into its vision tower's patches."""
    path = _checkpoint_dir(path)
    config = Qwen3OmniMoeConfig.from_pretrained(path, local_files_only=True)
    return ImageSettings.from_checkpoint(path, _sub_config(config, "thinker_config").vision_config)


def load_processor_parts(path: Path | str) -> tuple[PreTrainedTokenizerBase, WhisperFeatureExtractor]:
    """The checkpoint's tokenizer and log-mel feature extractor.

    The full Qwen3OmniMoeProcessor is avoided on purpose: it needs torchvision for its video part.
    """
    path = _checkpoint_dir(path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    feature_extractor = WhisperFeatureExtractor.from_pretrained(path, local_files_only=True)
    return tokenizer, feature_extractor
