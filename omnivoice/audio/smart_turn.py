"""The end-of-turn model: Smart Turn v3.2 (Pipecat's, BSD-2-Clause), its 8.7 MB ONNX file carried in
this package (`omnivoice/audio/turn_model/`, with its licence; the file as the `pipecat-ai` 1.14
wheel ships it), run through onnxruntime on the CPU.

It reads the Whisper-style features of a turn's last 8 s (turn_features.py) and gives the probability
that the speaker has finished their turn, from the sound of it (words, intonation, the pause), with no
transcript. The model takes a batch of any size ([B, 80, 800] -> [B, 1]), so the pauses of many
sessions are scored in one run. One `SmartTurn` per process holds the ONNX session (thread-safe).
Nothing is downloaded, and Pipecat is no dependency: its dependencies are many and heavy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from omnivoice.audio.turn_features import TurnFeatures

MODEL_NAME = "smart-turn-v3.2"
_MODEL_FILE = Path(__file__).parent / "turn_model" / "smart-turn-v3.2-cpu.onnx"


def default_model_path() -> Path:
    """The ONNX file carried in this package."""
    if not _MODEL_FILE.is_file():
        raise FileNotFoundError(f"the end-of-turn model is missing: {_MODEL_FILE}")
    return _MODEL_FILE


class SmartTurn:
    """The loaded model (about 0.3 s to load). `threads`: onnxruntime's intra-op threads per run."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3
        self._session = ort.InferenceSession(
            str(path or default_model_path()), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name
        self.features = TurnFeatures()

    def run(self, features: np.ndarray) -> np.ndarray:
        """Probabilities [B] that each turn is done, from features [B, 80, 800]."""
        (probs,) = self._session.run(None, {self._input: np.ascontiguousarray(features, np.float32)})
        return np.asarray(probs, dtype=np.float32).reshape(-1)

    def score(self, clips: Sequence[np.ndarray]) -> list[float]:
        """The probability that each turn (16 kHz mono float32, its end last) is done; one run."""
        if not clips:
            return []
        batch = np.stack([self.features(c) for c in clips])  # [B, 80, 800]
        return [float(p) for p in self.run(batch)]
