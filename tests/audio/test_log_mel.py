"""Log-mel features: a whole clip as transformers' Whisper feature extractor computes it, and a clip
featurized while it grows, which comes to the same features with every frame computed once."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor

from omnivoice.audio.log_mel import LogMel

RATE = 16000


@pytest.fixture(scope="module")
def extractor() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(
        feature_size=128, sampling_rate=RATE, hop_length=160, chunk_length=300, n_fft=400
    )


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    """Quiet noise with a loud stretch late in the clip (so the clip's maximum comes late)."""
    rng = np.random.default_rng(seed)
    pcm = 0.002 * rng.standard_normal(int(seconds * RATE))
    pcm[int(0.7 * pcm.size) : int(0.8 * pcm.size)] *= 250
    return pcm.astype(np.float32)


def reference(extractor: WhisperFeatureExtractor, pcm: np.ndarray) -> np.ndarray:
    out = extractor(
        pcm, sampling_rate=RATE, padding="longest", truncation=False, return_attention_mask=True,
        return_tensors="np",
    )  # fmt: skip
    frames = int(out["attention_mask"][0].sum())
    return out["input_features"][0, :, :frames]


@pytest.mark.parametrize("samples", [201, 359, 360, 16000, 16159, 48000 + 77])
def test_a_whole_clip_equals_the_feature_extractor(extractor, samples: int) -> None:
    pcm = speech(samples / RATE, seed=samples)
    features = LogMel.of(extractor)(pcm)
    assert features.dtype == np.float32 and features.shape == (128, samples // 160)
    np.testing.assert_array_equal(features, reference(extractor, pcm))


@pytest.mark.parametrize("chunk", [160, 320, 1000, 4096])
def test_a_stream_equals_the_whole_clip_and_computes_each_frame_once(extractor, chunk: int) -> None:
    log_mel = LogMel.of(extractor)
    pcm = speech(3.3, seed=chunk)
    stream = log_mel.stream()
    for at in range(0, pcm.size, chunk):
        stream.extend(pcm[at : at + chunk])
        stream.advance(at)  # the clip is known to reach the audio before this chunk
    assert stream.frames >= (pcm.size - chunk) // 160 - 2  # all but the last chunk's were done ahead
    features = stream.finish(pcm)
    assert log_mel.frames_computed == pcm.size // 160
    np.testing.assert_allclose(features, log_mel(pcm), rtol=0, atol=1e-6)


def test_a_stream_finished_on_a_shorter_clip_ignores_audio_past_its_end(extractor) -> None:
    """Speech stops before the end of what was received (the silence that ended the turn)."""
    log_mel = LogMel.of(extractor)
    pcm = speech(2.0)
    stream = log_mel.stream()
    stream.extend(pcm)
    stream.advance(24000)
    clip = pcm[:25000]
    np.testing.assert_allclose(stream.finish(clip), log_mel(clip), rtol=0, atol=1e-6)
    stream = log_mel.stream()
    stream.extend(pcm)
    stream.advance(30000)
    with pytest.raises(ValueError, match="shorter than the audio already featurized"):
        stream.finish(pcm[:20000])


def test_a_fork_finishes_a_shorter_clip_while_the_stream_goes_on(extractor) -> None:
    """A pause: the turn so far is featurized as the clip it would be, and the turn goes on."""
    log_mel = LogMel.of(extractor)
    pcm = speech(3.0)
    stream = log_mel.stream()
    stream.extend(pcm[:32000])
    stream.advance(30000)
    pause = 25000  # before audio the stream already read
    fork = stream.fork(pause)
    assert 0 < fork.frames < stream.frames
    np.testing.assert_allclose(fork.finish(pcm[:pause]), log_mel(pcm[:pause]), rtol=0, atol=1e-6)
    stream.extend(pcm[32000:])
    stream.advance(pcm.size)
    np.testing.assert_allclose(stream.finish(pcm), log_mel(pcm), rtol=0, atol=1e-6)


def test_frames_ahead_are_final_unless_a_louder_frame_comes(extractor) -> None:
    log_mel = LogMel.of(extractor)
    pcm = speech(4.0)  # loudest at 2.8-3.2 s
    stream = log_mel.stream()
    stream.extend(pcm)
    stream.advance(int(2.0 * RATE))
    early = stream.features(0, 100)
    after = stream.finish(pcm)[:, :100]
    quiet = np.full_like(pcm, 1e-4)  # nothing ever falls below the floor
    assert not np.array_equal(early, after)  # the floor rose: these frames must be recomputed
    stream = log_mel.stream()
    stream.extend(quiet)
    stream.advance(int(2.0 * RATE))
    np.testing.assert_array_equal(stream.features(0, 100), stream.finish(quiet)[:, :100])


def test_bad_audio_is_refused(extractor) -> None:
    log_mel = LogMel.of(extractor)
    with pytest.raises(ValueError, match="shorter than one feature frame"):
        log_mel(np.zeros(200, np.float32))
    with pytest.raises(ValueError, match="mono"):
        log_mel(np.zeros((2, 1000), np.float32))
    extractor = WhisperFeatureExtractor(feature_size=128, dither=1.0)
    with pytest.raises(ValueError, match="dither"):
        LogMel.of(extractor)
