"""Smart Turn v3.2, the ONNX model carried in the package (as the pipecat-ai wheel ships it), on the
benchmark's espeak-ng clips (benchmarks/turn_clips): its scores against saved reference scores of the
shipped model, and a batch scoring as its pauses would one by one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from omnivoice.audio.smart_turn import MODEL_NAME, SmartTurn, default_model_path
from omnivoice.audio.wav import decode_wav

CLIPS = Path(__file__).parents[2] / "benchmarks" / "turn_clips"
REFERENCE = json.loads((Path(__file__).parent / "smart_turn_reference.json").read_text())


def int8_kernels() -> str:
    """Which of the reference's score sets this CPU makes: onnxruntime's int8 products are exact with
    VNNI instructions and saturate in 16 bits without them, and this model's scores move with that."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "no_vnni"
    return "vnni" if "avx512_vnni" in flags or "avx_vnni" in flags else "no_vnni"


@pytest.fixture(scope="module")
def model() -> SmartTurn:
    return SmartTurn()


def _clips() -> dict[str, np.ndarray]:
    """Each clip as scored at its pause: a complete one with 96 ms of silence after it, a broken one
    up to 96 ms into its pause (the clip's own silence)."""
    manifest = json.loads((CLIPS / "clips.json").read_text())
    tail = REFERENCE["tail_samples"]
    out = {}
    for c in manifest["clips"]:
        pcm, rate = decode_wav((CLIPS / c["file"]).read_bytes())
        assert rate == 16000
        if c["kind"] == "complete":
            out[c["file"]] = np.concatenate([pcm, np.zeros(tail, np.float32)])
        else:
            out[c["file"]] = pcm[: c["pause"][0] + tail]
    return out


def test_the_shipped_model_is_found_without_a_download() -> None:
    path = default_model_path()
    assert path.is_file() and path.name.startswith(MODEL_NAME) and path.suffix == ".onnx"
    assert 1_000_000 < path.stat().st_size < 50_000_000


def test_scores_match_the_reference_of_the_shipped_model(model: SmartTurn) -> None:
    clips = _clips()
    scores = dict(zip(clips, model.score(list(clips.values())), strict=True))
    for name, ref in REFERENCE["scores"][int8_kernels()].items():
        assert scores[name] == pytest.approx(ref, abs=2e-3), name


def test_a_complete_question_scores_done_and_a_broken_one_not(model: SmartTurn) -> None:
    clips = _clips()
    complete, broken = model.score([clips["complete/02.wav"], clips["broken/02.wav"]])
    assert complete > 0.9  # "Please set an alarm for seven in the morning."
    assert broken < 0.5  # "What is the best way to ...": not done, on every kind of CPU


def test_a_batch_scores_as_its_clips_one_by_one(model: SmartTurn) -> None:
    clips = list(_clips().values())[:5]
    batch = model.score(clips)
    alone = [model.score([c])[0] for c in clips]
    np.testing.assert_allclose(batch, alone, atol=1e-4)
    assert model.score([]) == []
