"""Benchmark figures from per-request timing records, with vLLM-Omni's definitions.

All times in a record are seconds on one monotonic clock (`time.perf_counter()`), measured from
nothing in particular; only differences matter. Per request, from the send time `t0`:

- TTFT: first SSE chunk of modality text that carries text.
- TTFP: first SSE chunk of modality audio that carries audio.
- RTF: (arrival of the last audio chunk - t0) / seconds of audio received.
- playback stall: see `playback_stall`.

Over the run: audio-s/s = audio seconds of all successful requests / benchmark duration, and
output tok/s = text tokens of all successful requests / benchmark duration. Failed requests only
count in `errors`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """What one request's client saw. `audio_chunks` holds (arrival time, seconds of audio)."""

    t0: float
    first_text: float | None = None
    audio_chunks: list[tuple[float, float]] = field(default_factory=list)
    text_tokens: int = 0
    prompt_tokens: int | None = None  # the prompt's length as the engine counted it, where told
    end: float | None = None
    error: str | None = None
    first_audio_ms: dict[str, float] | None = None  # the engine's breakdown of the wait (types.FirstAudio)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def first_audio(self) -> float | None:
        return self.audio_chunks[0][0] if self.audio_chunks else None

    @property
    def last_audio(self) -> float | None:
        return self.audio_chunks[-1][0] if self.audio_chunks else None

    @property
    def audio_seconds(self) -> float:
        return sum(seconds for _, seconds in self.audio_chunks)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as numpy.percentile's default."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def percentile_interval(
    values: Sequence[float], q: float, level: float = 0.9, samples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A central `level` bootstrap interval of the q-th percentile: how far the percentile of a run
    of this many values moves with the luck of which values it drew (resampled with replacement, a
    fixed seed, so the same values give the same interval). None under 10 values, where a tail
    percentile's interval says nothing."""
    if len(values) < 10:
        return None
    rng = random.Random(seed)
    pool = list(values)
    draws = sorted(percentile(rng.choices(pool, k=len(pool)), q) for _ in range(samples))
    return central_interval(draws, level)


def central_interval(draws: Sequence[float], level: float) -> tuple[float, float]:
    """The central `level` interval of bootstrap `draws`, sorted and not empty: the values that leave
    (1 - level) / 2 of them below and as many above."""
    tail = (1 - level) / 2
    return draws[int(tail * (len(draws) - 1))], draws[round((1 - tail) * (len(draws) - 1))]


def playback_stall(chunks: Sequence[tuple[float, float]]) -> float:
    """Seconds a player that starts at the first audio chunk waits with an empty buffer.

    max over chunks of (arrival - (first arrival + audio received before that chunk)), clipped at 0.
    For a player that resumes as soon as the late chunk arrives this is its total waiting time;
    with a single stall (the usual case) it is that stall's length.
    """
    if not chunks:
        return 0.0
    start = chunks[0][0]
    played = 0.0
    worst = 0.0
    for arrival, seconds in chunks:
        worst = max(worst, arrival - (start + played))
        played += seconds
    return worst


def rtf(record: RequestRecord) -> float | None:
    """Real-time factor: (last audio arrival - t0) / audio seconds; None without audio."""
    audio = record.audio_seconds
    if record.last_audio is None or audio <= 0:
        return None
    return (record.last_audio - record.t0) / audio


@dataclass(frozen=True)
class Stats:
    mean: float | None = None
    p50: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Sequence[float], scale: float = 1.0) -> Stats:
        if not values:
            return cls()
        return cls(
            mean=scale * sum(values) / len(values),
            p50=scale * percentile(values, 50),
            p99=scale * percentile(values, 99),
        )


@dataclass(frozen=True)
class Summary:
    """Figures of one benchmark run (warm-ups excluded). Latencies in ms, None where nothing measured."""

    requests: int
    errors: int
    duration_s: float
    ttft_ms: Stats
    ttfp_ms: Stats
    rtf: Stats
    latency_ms: Stats
    audio_s_per_s: float
    output_tok_per_s: float
    audio_seconds: float
    text_tokens: int
    max_stall_ms: float | None
    mean_stall_ms: float | None
    no_audio: int
    first_audio_ms: dict[str, float] | None = None  # mean of each part of the breakdown, where given
    prompt_tokens: Stats = Stats()  # over the requests whose prompt length was told


def summarize(records: Sequence[RequestRecord], duration_s: float) -> Summary:
    """Aggregate the measured requests of a run that took `duration_s` seconds of wall time."""
    ok = [r for r in records if r.ok]
    with_audio = [r for r in ok if r.audio_seconds > 0 and r.first_audio is not None]
    ttft = [r.first_text - r.t0 for r in ok if r.first_text is not None]
    ttfp = [r.first_audio - r.t0 for r in with_audio if r.first_audio is not None]
    rtfs = [x for x in (rtf(r) for r in with_audio) if x is not None]
    latency = [r.end - r.t0 for r in ok if r.end is not None]
    stalls = [playback_stall(r.audio_chunks) for r in with_audio]
    audio_total = sum(r.audio_seconds for r in ok)
    tokens_total = sum(r.text_tokens for r in ok)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    return Summary(
        requests=len(ok),
        errors=len(records) - len(ok),
        duration_s=duration_s,
        ttft_ms=Stats.of(ttft, 1000.0),
        ttfp_ms=Stats.of(ttfp, 1000.0),
        rtf=Stats.of(rtfs),
        latency_ms=Stats.of(latency, 1000.0),
        audio_s_per_s=audio_total * per_s,
        output_tok_per_s=tokens_total * per_s,
        audio_seconds=audio_total,
        text_tokens=tokens_total,
        max_stall_ms=1000.0 * max(stalls) if stalls else None,
        mean_stall_ms=1000.0 * sum(stalls) / len(stalls) if stalls else None,
        no_audio=len(ok) - len(with_audio),
        first_audio_ms=_mean_parts([r.first_audio_ms for r in with_audio if r.first_audio_ms]),
        prompt_tokens=Stats.of([r.prompt_tokens for r in ok if r.prompt_tokens is not None]),
    )


def _mean_parts(breakdowns: list[dict[str, float]]) -> dict[str, float] | None:
    """The mean of each part over the breakdowns, None without any."""
    if not breakdowns:
        return None
    return {k: sum(b[k] for b in breakdowns) / len(breakdowns) for k in breakdowns[0]}
