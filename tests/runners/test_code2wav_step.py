"""Code2Wav at padded shapes: causal in time, so right-padded windows and padding rows change no sample.

On the CPU windows decode at their exact size; padding is what the GPU path does (and what its CUDA
graphs replay), so these tests switch it on and compare against the exact decode.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnivoice.config import ChunkConfig, Code2WavStage
from omnivoice.messages import CodecChunk, PcmOutput, StageFinished
from omnivoice.models.loader import load_model
from omnivoice.runners.code2wav import Code2WavRunner
from omnivoice.runners.code2wav_step import Code2WavStep


@pytest.fixture(scope="module")
def code2wav(tiny_checkpoint: Path) -> Any:
    torch.set_num_threads(1)
    return load_model(tiny_checkpoint).model.code2wav


def _codes(n: int, seed: int, groups: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, (groups, n), dtype=np.int64)  # [G, n]


@torch.inference_mode()
def _decode(code2wav: Any, codes: np.ndarray) -> np.ndarray:
    return code2wav(torch.from_numpy(codes)[None])[0, 0].numpy()


def test_code2wav_is_causal_so_right_padding_changes_no_sample(code2wav: Any) -> None:
    """A decode of n frames is the start of a decode of those frames followed by any others; exactly the
    samples past it (the transposed convolutions' unfinished tail) depend on the frames added."""
    up = int(code2wav.total_upsample)
    codes = _codes(120, seed=3)
    for n in (1, 4, 12, 29, 50, 73):  # 73: past the pre-transformer's sliding window (72)
        exact = _decode(code2wav, codes[:, :n])
        assert exact.shape[0] == n * up - 555
        for frames in (n + 1, n + 9, 120):
            padded = codes[:, :frames].copy()
            zeros = padded.copy()
            zeros[:, n:] = 0
            a, b = _decode(code2wav, padded), _decode(code2wav, zeros)
            assert a.shape[0] - (frames - n) * up == exact.shape[0]
            np.testing.assert_allclose(a[: exact.shape[0]], exact, rtol=0, atol=1e-6)
            np.testing.assert_allclose(b[: exact.shape[0]], exact, rtol=0, atol=1e-6)
            changed = np.nonzero(a != b)[0]
            assert changed[0] == exact.shape[0]  # the first sample that reads a padding frame


def test_padded_step_gives_each_window_its_exact_decode(code2wav: Any) -> None:
    step = Code2WavStep(code2wav, (4, 12, 28, 50), max_batch=8, device=torch.device("cpu"), graphs=False)
    assert not step.pad and step.frames(13) == 13 and step.rows(3) == 3
    step.pad = True
    assert step.frames(13) == step.frames(28) == 28 and step.frames(29) == 50 and step.rows(3) == 4
    windows = [_codes(n, seed=n) for n in (13, 28, 20)]  # three lengths, one forward of [4, G, 28]
    for window, wav in zip(windows, step(windows), strict=True):
        exact = _decode(code2wav, window)
        assert wav.shape == exact.shape
        np.testing.assert_allclose(wav, exact, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="cannot share a forward"):
        step([_codes(4, seed=0), _codes(5, seed=0)])


class _Recorder:
    """A Code2WavStep that notes the true and padded length of every window it decodes."""

    def __init__(self, step: Code2WavStep) -> None:
        self.step = step
        self.windows: list[tuple[int, int]] = []
        self.forwards = 0

    def frames(self, n: int) -> int:
        return self.step.frames(n)

    def __call__(self, windows: list[np.ndarray]) -> list[np.ndarray]:
        self.forwards += 1
        self.windows += [(w.shape[1], self.step.frames(w.shape[1])) for w in windows]
        return self.step(windows)


def _stream(runner: Code2WavRunner, streams: dict[str, np.ndarray], per_step: int) -> dict[str, np.ndarray]:
    """Feed every stream `per_step` frames at a time, one runner step after each round, to the end."""
    sent = dict.fromkeys(streams, 0)
    pcm: dict[str, list[np.ndarray]] = defaultdict(list)
    done: set[str] = set()
    while len(done) < len(streams):
        for rid, codes in streams.items():
            if sent[rid] < codes.shape[1]:
                frames = codes[:, sent[rid] : sent[rid] + per_step]
                sent[rid] += frames.shape[1]
                runner.accept(CodecChunk(rid, frames, sent[rid] == codes.shape[1]))
        for out in runner.step() if runner.has_work() else []:
            if isinstance(out, PcmOutput):
                assert out.index == len(pcm[out.request_id])
                pcm[out.request_id].append(out.pcm)
            elif isinstance(out, StageFinished):
                done.add(out.request_id)
    assert not runner.streams
    return {rid: np.concatenate(chunks) for rid, chunks in pcm.items()}


@pytest.mark.parametrize("per_step", [3, 200])  # frames arriving as the talker writes them; all at once
def test_runner_streams_the_same_audio_with_padding(code2wav: Any, per_step: int) -> None:
    cfg = Code2WavStage(max_batch=4)
    streams = {f"r{n}": _codes(n, seed=n) for n in (2, 9, 37, 69, 70)}
    audio, recorders = {}, {}
    for pad in (False, True):
        runner = Code2WavRunner(code2wav, cfg, ChunkConfig(), torch.device("cpu"), pad=pad)
        assert runner.vocoder.windows == (4, 12, 28, 50)
        recorders[pad] = runner.vocoder = _Recorder(runner.vocoder)  # type: ignore[assignment]
        audio[pad] = _stream(runner, streams, per_step)
    for rid, codes in streams.items():
        exact, padded = audio[False][rid], audio[True][rid]
        # gap-free: as many samples as one decode of the whole stream
        assert exact.shape == padded.shape == (codes.shape[1] * 1920 - 555,)
        np.testing.assert_allclose(padded, exact, rtol=0, atol=1e-6)
    padded_windows = recorders[True].windows
    assert all(frames in (4, 12, 28, 50) for _, frames in padded_windows)
    # only a stream's last (partial) chunk is ever padded, and padding lets it join the full windows
    assert sum(n != frames for n, frames in padded_windows) <= len(streams)
    assert recorders[True].forwards <= recorders[False].forwards
    if per_step > 70:  # r2's whole 2-frame stream shares the 4-frame first chunks' forward, and so on
        assert recorders[True].forwards < recorders[False].forwards


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_give_the_same_audio_as_eager(tiny_checkpoint: Path) -> None:
    model = load_model(tiny_checkpoint).model.code2wav.to("cuda:0", torch.bfloat16)
    cfg = Code2WavStage(device="cuda:0", dtype="bfloat16", max_batch=8, execution="cuda_graph")
    runner = Code2WavRunner(model, cfg, ChunkConfig(), torch.device("cuda:0"))
    step = runner.vocoder
    assert len(step.graphs.captured) == len(step.batch_sizes) * len(step.windows)  # all at build
    streams = {f"r{n}": _codes(n, seed=n) for n in (2, 9, 37, 69, 70, 100)}
    for per_step in (3, 200):
        graphed = _stream(runner, streams, per_step)
        step.graphs.enabled = False
        eager = _stream(runner, streams, per_step)
        step.graphs.enabled = True
        for rid, codes in streams.items():
            assert graphed[rid].shape == (codes.shape[1] * 1920 - 555,)
            np.testing.assert_array_equal(graphed[rid], eager[rid])
