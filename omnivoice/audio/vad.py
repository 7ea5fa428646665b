"""Silero VAD (the ONNX model shipped in the `silero-vad` wheel), run through onnxruntime.

One `SileroVad` per process holds the ONNX session (thread-safe, shared); each audio stream gets its
own `VadStream` with the model's recurrent state. The model scores 512-sample frames (32 ms) of
16 kHz audio, each preceded by the last 64 samples of the previous frame, as silero's own wrapper
feeds it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
FRAME = 512  # samples per scored frame at 16 kHz: 32 ms
FRAME_MS = 1000 * FRAME // SAMPLE_RATE
_CONTEXT = 64
_MODEL_FILE = "silero_vad.onnx"


def default_model_path() -> Path:
    """The ONNX file in the installed `silero-vad` package (found without importing it: torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the silero-vad package is not installed")
    path = Path(spec.origin).parent / "data" / _MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"silero-vad has no {_MODEL_FILE} at {path}")
    return path


class SileroVad:
    """The loaded model. Loading takes ~0.1 s; `run` is safe to call from several threads."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self._session = ort.InferenceSession(
            str(path or default_model_path()), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def stream(self) -> VadStream:
        return VadStream(self)

    def run(self, frame: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """Score one frame [1, 64 + 512] with recurrent state [2, 1, 128]; returns (prob, new state)."""
        prob, new_state = self._session.run(None, {"input": frame, "state": state, "sr": self._sr})
        return float(prob[0, 0]), new_state


class VadStream:
    """Speech probabilities of one 16 kHz stream, one per completed 32 ms frame."""

    def __init__(self, model: SileroVad) -> None:
        self._model = model
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(_CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)

    def process(self, pcm: np.ndarray) -> list[float]:
        """Append 16 kHz float32 audio; the speech probability of every frame it completes."""
        buf = np.concatenate([self._pending, np.asarray(pcm, dtype=np.float32).reshape(-1)])
        n = len(buf) // FRAME
        probs = []
        for i in range(n):
            frame = buf[i * FRAME : (i + 1) * FRAME]
            x = np.concatenate([self._context, frame])[None, :]  # [1, 576]
            prob, self._state = self._model.run(x, self._state)
            self._context = frame[-_CONTEXT:]
            probs.append(prob)
        self._pending = buf[n * FRAME :].copy()
        return probs

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(_CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)
