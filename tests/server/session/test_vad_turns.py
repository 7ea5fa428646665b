"""Silero VAD on espeak-ng speech, and the server_vad turn detector and input buffer on top of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soxr

from omnivoice.audio.vad import FRAME, SileroVad
from omnivoice.server.session.input_audio import (
    BufferFull,
    InputBuffer,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)
from omnivoice.server.session.session_config import TurnDetection
from tests.support.speech import speak


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    pcm = speak("Hello there, this is a test of voice activity detection.", tmp_path_factory.mktemp("vad"))
    return soxr.resample(pcm, 24000, 16000).astype(np.float32)


def test_speech_scores_high_and_silence_low(vad: SileroVad, speech: np.ndarray) -> None:
    stream = vad.stream()
    silence = stream.process(np.zeros(16000, np.float32))
    assert len(silence) == 16000 // FRAME and max(silence) < 0.2
    voiced = stream.process(speech)
    assert np.mean(np.array(voiced) > 0.5) > 0.5


def test_chunking_does_not_change_probabilities(vad: SileroVad, speech: np.ndarray) -> None:
    whole = vad.stream().process(speech)
    stream, pieces = vad.stream(), []
    for i in range(0, speech.size, 333):
        pieces += stream.process(speech[i : i + 333])
    np.testing.assert_allclose(pieces, whole[: len(pieces)], atol=1e-5)


def test_turn_detector_on_speech(vad: SileroVad, speech: np.ndarray) -> None:
    audio = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(16000, np.float32)])
    detector = TurnDetector(TurnDetection(silence_duration_ms=500))
    events = detector.update(vad.stream().process(audio))
    turns = [e for e in events if isinstance(e, SpeechStarted | SpeechStopped)]
    assert [type(e) for e in turns] == [
        SpeechStarted,
        SpeechStopped,
    ]  # espeak's short pauses stay in one turn
    assert abs(turns[0].position - 8000) < 3 * FRAME
    end_of_speech = 8000 + speech.size
    assert end_of_speech < turns[1].position < end_of_speech + 16000
    # every pause but the last is ended by more speech; the last one ends the turn where the speech ended
    pauses = [e for e in events if isinstance(e, SpeechPaused | SpeechResumed)]
    assert [type(e) for e in pauses] == [SpeechPaused, SpeechResumed] * (len(pauses) // 2) + [SpeechPaused]
    assert pauses[-1].position < turns[1].position and abs(pauses[-1].position - end_of_speech) < 8 * FRAME


def test_turn_detector_thresholds() -> None:
    d = TurnDetector(TurnDetection(threshold=0.5, silence_duration_ms=64))
    assert d.update([0.9, 0.1, 0.9]) == []  # one frame is a click, not speech
    assert d.update([0.9]) == [SpeechStarted(2 * FRAME)]
    assert d.update([0.4, 0.4, 0.4]) == []  # between the thresholds: still speaking
    assert d.update([0.1, 0.4, 0.9]) == [SpeechPaused(8 * FRAME), SpeechResumed(9 * FRAME)]
    assert d.update([0.1, 0.1]) == [SpeechPaused(11 * FRAME), SpeechStopped(12 * FRAME)]


def test_a_pause_as_long_as_the_silence_window_ends_the_turn_in_one_update() -> None:
    d = TurnDetector(TurnDetection(threshold=0.5, silence_duration_ms=32))  # one frame of silence
    assert d.update([0.9, 0.9, 0.1]) == [SpeechStarted(0), SpeechPaused(3 * FRAME), SpeechStopped(3 * FRAME)]


def test_input_buffer_take_trim_and_limit() -> None:
    b = InputBuffer(max_samples=100)
    b.append(np.arange(60, dtype=np.float32))
    b.trim(10)
    assert (b.start, b.end, b.samples) == (10, 60, 50)
    b.append(np.arange(60, 110, dtype=np.float32))
    with pytest.raises(BufferFull):
        b.append(np.zeros(1, np.float32))
    np.testing.assert_array_equal(b.take(0, 20), np.arange(10, 20))  # clipped to what is held
    assert b.start == 20 and b.take(100, 200).tolist() == list(range(100, 110)) and b.samples == 0


def test_model_path_is_inside_the_silero_package() -> None:
    from omnivoice.audio.vad import default_model_path

    path = default_model_path()
    assert isinstance(path, Path) and path.name.endswith(".onnx") and "silero_vad" in str(path)


def test_gaps_between_words_shorter_than_pause_ms_are_no_pauses() -> None:
    d = TurnDetector(TurnDetection(threshold=0.5, silence_duration_ms=320), pause_ms=96)  # 3 frames
    assert d.update([0.9, 0.9]) == [SpeechStarted(0)]
    assert d.update([0.1, 0.1, 0.9]) == []  # a 64 ms gap between words: no pause, nothing resumed
    # a 96 ms silence is a pause, placed where the silence began (its first frame's end)
    assert d.update([0.1, 0.1, 0.1]) == [SpeechPaused(6 * FRAME)]
    assert d.update([0.9]) == [SpeechResumed(8 * FRAME)]
    assert d.update([0.1] * 10) == [SpeechPaused(10 * FRAME), SpeechStopped(19 * FRAME)]
