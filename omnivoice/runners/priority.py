"""First audio first: the order in which a stage serves its requests, from where their playback stands.

    slack = seconds of audio produced - seconds since the request's first audio left the engine

Each stage measures the audio produced from its own output: the thinker's tokens (the talker turns
at most one into a frame while text streams in), the talker's frames, Code2Wav's decoded frames.
What a stage has produced is never behind what was played, so each stage's slack is an upper bound of
the true one, and the stage furthest behind sees a request's real state. The time of the first audio
is Code2Wav's own for its requests; the engine tells the thinker and the talker (`AudioStarted`).

Classes, served in this order (`Priority` sorts that way):
- DRY: slack under the low watermark, about to run dry;
- FIRST: no audio yet (its prefill, its first talker frames, its first Code2Wav chunk);
- NORMAL;
- AHEAD: slack over the high watermark; such work may wait while FIRST or DRY work is anywhere on the
  stage's device, and falls back to NORMAL (and runs) as its slack shrinks, so it is never starved.
Nothing is paced to real time: with no FIRST or DRY work anywhere, every request runs at full speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

from omnivoice.config import PriorityConfig

T = TypeVar("T")


class Priority(IntEnum):
    """A request's class; lower values are served first."""

    DRY = 0
    FIRST = 1
    NORMAL = 2
    AHEAD = 3

    @property
    def urgent(self) -> bool:
        """DRY and FIRST: work that other work gives way to."""
        return self <= Priority.FIRST


def classify(audio_s: float, since_first_audio_s: float | None, low_s: float, high_s: float) -> Priority:
    """The class of a request that has `audio_s` seconds of audio produced, `since_first_audio_s`
    seconds after its first audio (None: none yet), for watermarks `low_s` < `high_s`."""
    if since_first_audio_s is None:
        return Priority.FIRST
    slack = audio_s - since_first_audio_s
    if slack < low_s:
        return Priority.DRY
    if slack > high_s:
        return Priority.AHEAD
    return Priority.NORMAL


@dataclass
class Playback:
    """Where one request's playback stands, as one stage sees it: when its first audio left
    (monotonic seconds; None: not yet), the codec frames of audio this stage has produced for it, and
    whether it is a stream at all. A request without audio (text only, prefill only) is FIRST until
    its first output (`started_at`), then NORMAL: never DRY or AHEAD."""

    started_at: float | None = None
    frames: float = 0.0
    stream: bool = True

    def start(self, now: float) -> None:
        """Its first audio (or first output) left now, unless it already had."""
        if self.started_at is None:
            self.started_at = now


class PlaybackPolicy:
    """One stage's use of the policy: classes of its requests, their order, what may wait."""

    def __init__(
        self, cfg: PriorityConfig, frame_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cfg = cfg
        self.frame_s = frame_s  # seconds of audio in one codec frame
        self.clock = clock

    def priority(self, pb: Playback, now: float | None = None) -> Priority:
        if not self.cfg.enabled:
            return Priority.NORMAL
        if not pb.stream:
            return Priority.FIRST if pb.started_at is None else Priority.NORMAL
        now = self.clock() if now is None else now
        since = None if pb.started_at is None else now - pb.started_at
        return classify(pb.frames * self.frame_s, since, self.cfg.low_watermark_s, self.cfg.high_watermark_s)

    def order(self, items: Iterable[T], playback: Callable[[T], Playback]) -> list[T]:
        """`items` in service order: by class, arrival order within a class (a stable sort)."""
        items = list(items)
        if not self.cfg.enabled:
            return items
        now = self.clock()
        return sorted(items, key=lambda x: self.priority(playback(x), now))

    def select(self, items: Iterable[T], playback: Callable[[T], Playback], defer_ahead: bool) -> list[T]:
        """`items` in service order, without the AHEAD ones when `defer_ahead` (FIRST or DRY work is
        waiting somewhere on this device)."""
        ordered = self.order(items, playback)
        if not defer_ahead or not self.cfg.enabled:
            return ordered
        now = self.clock()
        return [x for x in ordered if self.priority(playback(x), now) != Priority.AHEAD]

    def urgency(self, playbacks: Iterable[Playback]) -> Priority | None:
        """The most urgent class among `playbacks` (the work a stage holds), None if there is none."""
        now = self.clock()
        return min((self.priority(pb, now) for pb in playbacks), default=None)
