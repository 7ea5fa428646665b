"""Silero VAD (the ONNX model shipped in the `silero-vad` wheel), run through onnxruntime.

One `SileroVad` per process holds the ONNX session (thread-safe, shared); each audio stream gets its
own `VadStream` with the model's recurrent state. The model scores 512-sample frames (32 ms) of
16 kHz audio, each preceded by the last 64 samples of the previous frame, as silero's own wrapper
feeds it. `score_streams` scores the new audio of many streams together: one model run per frame
step over every stream that has that frame (the model takes a batch of frames with their states),
with the probabilities of scoring each stream alone.
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
        probs, new_state = self.run_batch(frame, state)
        return float(probs[0]), new_state

    def run_batch(self, frames: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score B frames [B, 64 + 512] of B streams with their states [2, B, 128]; returns (probs [B],
        new states [2, B, 128])."""
        prob, new_state = self._session.run(None, {"input": frames, "state": state, "sr": self._sr})
        return prob[:, 0], new_state


class VadStream:
    """Speech probabilities of one 16 kHz stream, one per completed 32 ms frame."""

    def __init__(self, model: SileroVad) -> None:
        self._model = model
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(_CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)

    @property
    def model(self) -> SileroVad:
        return self._model

    def process(self, pcm: np.ndarray) -> list[float]:
        """Append 16 kHz float32 audio; the speech probability of every frame it completes."""
        probs = []
        for x in self.frames(pcm):
            prob, self._state = self._model.run(x[None, :], self._state)
            probs.append(prob)
        return probs

    def frames(self, pcm: np.ndarray) -> np.ndarray:
        """Append 16 kHz float32 audio; the model inputs [n, 64 + 512] of the n frames it completes,
        each after its context, to be scored in order from the stream's state (`process` does)."""
        buf = np.concatenate([self._pending, np.asarray(pcm, dtype=np.float32).reshape(-1)])
        n = len(buf) // FRAME
        framed = buf[: n * FRAME].reshape(n, FRAME)
        context = np.concatenate([self._context[None, :], framed[:-1, -_CONTEXT:]])[:n]
        if n:
            self._context = framed[-1, -_CONTEXT:].copy()
        self._pending = buf[n * FRAME :].copy()
        return np.concatenate([context, framed], axis=1)

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(_CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)


def score_streams(model: SileroVad, audio: list[tuple[VadStream, np.ndarray]]) -> list[list[float]]:
    """Append each (stream, 16 kHz audio) pair's audio to its stream, scoring every stream's new frames
    together: step j is one model run over the streams that have a j-th new frame (their states
    stacked, then split back). Returns each stream's probabilities, as its `process` would. The
    streams must be distinct and of `model`."""
    inputs = [stream.frames(pcm) for stream, pcm in audio]  # each [n_i, 576]
    probs: list[list[float]] = [[] for _ in audio]
    for step in range(max((x.shape[0] for x in inputs), default=0)):
        rows = [i for i, x in enumerate(inputs) if x.shape[0] > step]
        frames = np.stack([inputs[i][step] for i in rows])  # [B, 576]
        state = np.concatenate([audio[i][0]._state for i in rows], axis=1)  # [2, B, 128]
        step_probs, state = model.run_batch(frames, state)
        for b, i in enumerate(rows):
            probs[i].append(float(step_probs[b]))
            audio[i][0]._state = state[:, b : b + 1]
    return probs
