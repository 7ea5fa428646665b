"""What an engine serves: the model source a profile names, and what the engine's own side needs of
it (the model's spec, its tokenizer, the prompt builder, the limits it tells clients).

The stage workers load the weights themselves (runners/factory.py); the engine loads only what turns
chat messages into prompts and token ids back into text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnivoice.config import Profile
from omnivoice.engine.model_source import resolve_model_path
from omnivoice.models.dummy import dummy_spec
from omnivoice.models.dummy_source import DummySource
from omnivoice.models.dummy_tokenizer import load_dummy_processor_parts
from omnivoice.models.loader import ModelSpec, load_image_settings, load_processor_parts
from omnivoice.models.prompt import PromptBuilder
from omnivoice.types import TALKER_PROMPT_EXTRA, ModelInfo


@dataclass(frozen=True)
class ServedModel:
    """The engine's side of a model: where it comes from and how prompts are built for it."""

    source: Path | DummySource
    spec: ModelSpec
    tokenizer: Any  # a transformers tokenizer (a dummy model's is built from code)
    builder: PromptBuilder


def load_served_model(profile: Profile, source: Path | DummySource | None = None) -> ServedModel:
    """Read the spec, tokenizer and feature extractor of `source` (default: the profile's model)."""
    path = resolve_model_path(profile) if source is None else source
    if isinstance(path, DummySource):  # random weights; a tokenizer of the real vocabulary's layout
        spec = dummy_spec(path)
        tokenizer, feature_extractor = load_dummy_processor_parts(profile.model.cache_dir)
        images = None
    else:
        tokenizer, feature_extractor = load_processor_parts(path)
        spec = ModelSpec.from_pretrained(path)
        images = load_image_settings(path)
    max_audio = profile.server.max_audio_seconds
    builder = PromptBuilder(
        tokenizer, feature_extractor, spec, max_audio_seconds=max_audio, image_settings=images
    )
    return ServedModel(path, spec, tokenizer, builder)


def model_info(profile: Profile, spec: ModelSpec, builder: PromptBuilder) -> ModelInfo:
    """What clients are told of the served model: its name, voices and prompt limits."""
    voices = tuple(sorted(spec.speaker_ids))
    default_voice = profile.model.default_voice if profile.model.default_voice in voices else voices[0]
    # the thinker's context, and the talker's room for a prompt's audio (else it could only fail)
    max_prompt_tokens = min(
        profile.stages.thinker.max_seq_len - 1,
        profile.stages.talker.max_seq_len - TALKER_PROMPT_EXTRA,
    )
    return ModelInfo(
        served_name=profile.model.served_name,
        sample_rate=spec.output_sample_rate,
        voices=voices,
        default_voice=default_voice,
        max_prompt_tokens=max_prompt_tokens,
        max_prompt_chars=max_prompt_tokens * builder.max_token_chars,
        audio_window_frames=spec.audio_window_frames,
    )
