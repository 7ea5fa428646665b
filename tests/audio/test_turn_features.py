"""The end-of-turn model's features against transformers' WhisperFeatureExtractor, which the model
was trained with (8 s, zero-padded in front, normalized)."""

from __future__ import annotations

import numpy as np
import pytest

from omnivoice.audio.turn_features import FRAMES, N_MELS, WINDOW_SAMPLES, TurnFeatures, mel_filters


def _reference(pcm: np.ndarray) -> np.ndarray:
    from transformers import WhisperFeatureExtractor

    x = pcm[-WINDOW_SAMPLES:]
    x = np.concatenate([np.zeros(WINDOW_SAMPLES - x.size, np.float32), x])  # as Smart Turn pads
    extractor = WhisperFeatureExtractor(chunk_length=8)
    out = extractor(
        x, sampling_rate=16000, return_tensors="np", padding="max_length", max_length=WINDOW_SAMPLES,
        truncation=True, do_normalize=True,
    )  # fmt: skip
    return out.input_features[0]


@pytest.mark.parametrize("seconds", [0.7, 3.0, 8.0, 11.5])
def test_features_match_the_whisper_extractor(seconds: float) -> None:
    rng = np.random.default_rng(int(seconds * 10))
    t = np.arange(int(seconds * 16000)) / 16000
    pcm = 0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.5 < 0.3) + 0.01 * rng.standard_normal(t.size)
    pcm = pcm.astype(np.float32)
    ours = TurnFeatures()(pcm)
    assert ours.shape == (N_MELS, FRAMES) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, _reference(pcm), atol=2e-4)


def test_mel_filters_match_transformers() -> None:
    from transformers.audio_utils import mel_filter_bank

    ref = mel_filter_bank(201, 80, 0.0, 8000.0, 16000, norm="slaney", mel_scale="slaney")
    np.testing.assert_allclose(mel_filters(), ref, rtol=1e-6, atol=1e-9)


def test_only_the_last_8_seconds_count() -> None:
    rng = np.random.default_rng(0)
    tail = (0.1 * rng.standard_normal(WINDOW_SAMPLES)).astype(np.float32)
    longer = np.concatenate([np.ones(16000, np.float32), tail])
    features = TurnFeatures()
    np.testing.assert_array_equal(features(longer), features(tail))
