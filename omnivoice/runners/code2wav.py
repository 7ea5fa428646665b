"""Code2Wav runner: decodes codec frames to 24 kHz audio in streamed chunks, gap-free.

Chunk n covers frames [s, e) and is decoded together with `left_context` frames before s. The
vocoder's transposed convolutions cannot finish the last samples of a window without the next frame,
so a decode of frames [a, e) yields only its first (e - a) * upsample - lost samples. Instead of
dropping what is missing (as transformers' chunked_decode does, leaving gaps), we emit audio up to
where the window really ends and start the next chunk from there.

The forwards themselves (padding to fixed shapes on a GPU, CUDA graphs) are `Code2WavStep`'s.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnivoice.config import ChunkConfig, Code2WavStage, PriorityConfig
from omnivoice.messages import CodecChunk, FirstAudioTimes, PcmOutput, StageFinished
from omnivoice.runners.chunking import chunk_frames, window_lengths
from omnivoice.runners.code2wav_step import Code2WavStep, cudnn_autotuning
from omnivoice.runners.graph_backlog import GraphBacklog
from omnivoice.runners.priority import Playback, PlaybackPolicy, Priority
from omnivoice.runners.start_steps import StartSteps
from omnivoice.runners.vocoder_kernels import fuse_snakes, unfuse_snakes
from omnivoice.types import StageStats

log = logging.getLogger(__name__)


@dataclass
class _Stream:
    frames: list[np.ndarray] = field(default_factory=list)  # each [G, n]
    total: int = 0  # frames received
    decoded_to: int = 0  # frames covered by emitted chunks
    emitted: int = 0  # samples emitted
    chunks: int = 0
    finished: bool = False
    codes: np.ndarray | None = None
    playback: Playback = field(default_factory=Playback)  # started at its first chunk; frames decoded
    accepted_at: float = 0.0  # monotonic: when the talker took the request
    first_frame_at: float | None = None  # monotonic: when its first frame arrived (the arrival rate)
    window_made_at: float = 0.0  # when the talker made the frame that completed its first chunk

    def all_codes(self) -> np.ndarray:
        if self.frames:
            self.codes = np.concatenate(
                ([self.codes] if self.codes is not None else []) + self.frames, axis=1
            )
            self.frames = []
        assert self.codes is not None
        return self.codes


class Code2WavRunner:
    name = "code2wav"

    def __init__(
        self,
        code2wav: Any,
        cfg: Code2WavStage,
        chunk: ChunkConfig,
        device: torch.device,
        pad: bool | None = None,
        priority: PriorityConfig | None = None,
        frame_s: float = 0.08,
        start: StartSteps | None = None,
    ) -> None:
        """`pad`: decode at the padded shapes of a GPU (default: on CUDA devices only); `frame_s`: the
        seconds of audio in one codec frame; `start`: where the steps of the build are timed."""
        self.model = code2wav
        self.cfg = cfg
        self.chunk = chunk
        self.device = device
        self.upsample = int(code2wav.total_upsample)
        self.policy = PlaybackPolicy(priority or PriorityConfig(), frame_s)
        graphs = cfg.execution == "cuda_graph"
        self.vocoder = Code2WavStep(
            code2wav,
            window_lengths(chunk),
            cfg.max_batch,
            device,
            graphs,
            pad,
            tune_from_batch=cfg.cudnn_tune_from_batch,
            benchmark_limit=cfg.cudnn_benchmark_limit,
        )
        self.graph_backlog = GraphBacklog(self.name)  # graphs of wide batches captured once serving
        self.streams: dict[str, _Stream] = {}
        self._decoding: list[str] = []  # the streams of the step's decode while it runs
        self._steps = 0
        self._last_batch = 0
        self._step_s = 0.0  # moving average of a decode's time
        if device.type == "cuda":
            steps = start or StartSteps(self.name)
            with cudnn_autotuning():  # the fused kernels' first decode included
                if cfg.compile:
                    with steps.step("activations"):
                        self._fuse_activations()
                with steps.step("graphs" if graphs else "shapes"):
                    self.vocoder.warm_up(cfg.graphs_at_start, self.graph_backlog)

    @torch.inference_mode()
    def _fuse_activations(self) -> None:
        """Fused SnakeBeta kernels (compiled here, by a first decode), or transformers' if that fails."""
        began = time.perf_counter()
        n = fuse_snakes(self.model)
        groups = int(self.model.config.num_quantizers)
        try:
            self.model(torch.zeros(1, groups, 8, dtype=torch.long, device=self.device))
        except Exception as e:  # no compiler toolchain for the generated kernel, for one
            unfuse_snakes(self.model)
            log.warning(
                "code2wav: fused activations unavailable (%s: %s); using transformers'", type(e).__name__, e
            )
            return
        log.info("code2wav: %d SnakeBeta activations fused in %.1f s", n, time.perf_counter() - began)

    def accept(self, msg: Any) -> list[Any]:
        if not isinstance(msg, CodecChunk):
            raise TypeError(f"code2wav cannot take {type(msg).__name__}")
        st = self.streams.get(msg.request_id)
        if st is None:
            st = self.streams[msg.request_id] = _Stream()
        frames = np.asarray(msg.frames)
        if msg.first:
            st.accepted_at = msg.accepted_at
        if frames.shape[1]:
            if st.first_frame_at is None:
                st.first_frame_at = self.policy.clock()
            st.frames.append(frames)
            if st.total < self.chunk.first_frames <= st.total + frames.shape[1]:
                st.window_made_at = msg.made_at
            st.total += frames.shape[1]
        st.finished = st.finished or msg.finished
        return []

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)
        if request_id in self._decoding:
            self._decoding.remove(request_id)

    def _target(self, st: _Stream) -> int:
        """End frame of the next chunk, or 0 if it cannot be decoded yet."""
        size = chunk_frames(self.chunk, st.chunks)
        pending = st.total - st.decoded_to
        if pending >= size:
            return st.decoded_to + size
        if st.finished:
            return st.total if st.total > st.decoded_to else -1  # -1: finished, nothing left
        if self.chunk.catch_up and pending >= self.chunk.first_frames and self._late(st, size - pending):
            return st.total
        return 0

    def _late(self, st: _Stream, missing: int) -> bool:
        """Whether `missing` more frames, arriving at the rate the stream's frames have so far, would
        complete its chunk only after its playback has run dry (a decode step's time to spare).

        Never for a stream whose frames come slower than real time: it runs dry whatever is done, and
        each short chunk decodes its left context again (a 4-frame chunk costs as much per frame as
        several full ones), work taken from the talker that makes the frames, on a shared CPU."""
        if st.playback.started_at is None or st.first_frame_at is None:
            return False
        now = self.policy.clock()
        elapsed = now - st.first_frame_at
        if elapsed <= 0:
            return False
        rate = st.total / elapsed  # frames per second
        if rate * self.policy.frame_s < 1.0:
            return False
        slack = st.playback.frames * self.policy.frame_s - (now - st.playback.started_at)
        return slack - 2 * self._step_s < missing / rate

    def has_work(self) -> bool:
        return any(self._target(st) != 0 for st in self.streams.values())

    def urgency(self) -> Priority | None:
        return self.policy.urgency(st.playback for st in self.streams.values() if self._target(st) > 0)

    def active_ids(self) -> list[str]:
        # a step that fails fails the streams it was decoding: the others' state is untouched (each
        # stream's own advances only once its window is decoded)
        return list(self._decoding) if self._decoding else list(self.streams)

    def stats(self) -> StageStats:
        return StageStats(self.name, 0, len(self.streams), self._last_batch, self._steps)

    @torch.inference_mode()
    def step(self, defer_ahead: bool = False) -> list[Any]:
        """Decode the next chunk of up to max_batch streams, in playback order (without the AHEAD
        ones when `defer_ahead`), one window length per step."""
        outs: list[Any] = []
        ready: list[tuple[str, _Stream, int]] = []
        self._decoding = []
        done: list[str] = []  # ended, all decoded: told once this step's decode has gone through
        for rid, st in self.streams.items():
            end = self._target(st)
            if end > 0:
                ready.append((rid, st, end))
            elif st.finished and st.decoded_to >= st.total:
                done.append(rid)
        now = self.policy.clock()
        windows: dict[int, list[tuple[str, _Stream, int, int]]] = {}  # decoded length -> chunks
        ranks: dict[int, Priority] = {}  # decoded length -> its most urgent chunk's class
        for rid, st, end in self.policy.select(ready, _playback, defer_ahead)[: self.cfg.max_batch]:
            start = max(0, st.decoded_to - self.chunk.left_context)
            length = self.vocoder.frames(end - start)
            windows.setdefault(length, []).append((rid, st, start, end))
            ranks[length] = min(ranks.get(length, Priority.AHEAD), self.policy.priority(st.playback, now))
        self._last_batch = 0
        if windows:
            # Windows decoded at the same length (padded on a GPU: a final partial chunk joins the
            # full ones) go together, in one forward. One length per step: that of the most urgent
            # chunk, the shortest among equals, so a new request's first chunk (the shortest window)
            # never waits behind a batch of long ones, and its audio leaves as soon as its own small
            # forward is done; a stream about to run dry goes before it.
            chunks = windows[min(windows, key=lambda n: (ranks[n], n))]
            self._decoding = [rid for rid, *_ in chunks]
            outs += self._decode(chunks)
            self._decoding = []
            self._last_batch = len(chunks)
        for rid in done:
            outs.append(StageFinished(rid, "code2wav", "stop", self.streams.pop(rid).total))
        self._steps += 1
        return outs

    def _decode(self, chunks: list[tuple[str, _Stream, int, int]]) -> list[Any]:
        began = time.monotonic()
        wavs = self.vocoder([st.all_codes()[:, start:end] for _, st, start, end in chunks])  # [samples]
        done = time.monotonic()
        self._step_s += 0.2 * (done - began - self._step_s)
        outs: list[Any] = []
        for (rid, st, start, end), wav in zip(chunks, wavs, strict=True):
            window_end = start * self.upsample + wav.shape[0]  # absolute sample where this decode stops
            pcm = wav[st.emitted - start * self.upsample :]
            st.emitted = window_end
            st.decoded_to = end
            first = None
            if st.chunks == 0:
                first = FirstAudioTimes(st.accepted_at, st.window_made_at or done, began, done)
            st.chunks += 1
            outs.append(PcmOutput(rid, st.chunks - 1, pcm.copy(), first))
            st.playback.start(self.policy.clock())
            st.playback.frames = end
            if st.finished and st.decoded_to >= st.total:
                outs.append(StageFinished(rid, "code2wav", "stop", st.total))
                del self.streams[rid]
        return outs


def _playback(item: tuple[str, _Stream, int]) -> Playback:
    return item[1].playback
