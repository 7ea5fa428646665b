"""How the server delivers a response's audio, seen from the server (`DeliveryStats`, on /metrics).

A caller's voice-to-voice time is measured at the caller, across the socket; these figures say what
part of it the server adds before the socket, per response:

- first text and first audio: from the response's start (the turn's end, with server VAD) to its
  first text delta and first audio delta queued on the connection's outbox. A speculative start's
  outputs made before the turn ended are there at once, so its times are short;
- the engine's first audio, part by part (types.FirstAudio: the thinker's queue, prefill and first
  token, the hand-off to the talker, the talker's prefill and first frames, the hand-off to
  Code2Wav, its decode, the way back), counted from the engine request's start, which for a
  speculative start is before the turn's end;
- underrun: the seconds a player that starts at the response's first audio delta would have waited
  with an empty buffer, as the server queued the deltas (the pacer's dry spells: the engine's audio
  came later than real-time playback needed it). A caller who hears more stall than this lost it
  after the outbox (the socket, the network, the client).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from omnivoice.types import FirstAudio, SecondsHistogram

# upper bounds (seconds) of the histograms' buckets
DELIVERY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
PHASES = ("first_text", "first_audio")
# the parts of the engine's first audio (FirstAudio's fields, less their _ms)
PARTS = tuple(f.name.removesuffix("_ms") for f in fields(FirstAudio))


@dataclass
class DeliveryStats:
    """The app's responses since it started: each PHASES' time (of the responses that reached it),
    each PARTS' time (of the responses whose engine request made audio) and each response's underrun
    (of the responses that sent audio)."""

    phases: dict[str, SecondsHistogram] = field(default_factory=lambda: _each(PHASES))
    parts: dict[str, SecondsHistogram] = field(default_factory=lambda: _each(PARTS))
    underrun: SecondsHistogram = field(default_factory=lambda: SecondsHistogram("underrun", DELIVERY_BUCKETS))

    def reached(self, phase: str, seconds: float) -> None:
        self.phases[phase].record(seconds)

    def engine_first_audio(self, first: FirstAudio) -> None:
        for part in PARTS:
            self.parts[part].record(getattr(first, f"{part}_ms") / 1000)

    def delivered(self, underrun_s: float) -> None:
        self.underrun.record(underrun_s)


def parts_text(first: FirstAudio) -> str:
    """The engine's parts of a first audio's wait, for a log line: "to_first_token 130 ms, ..."."""
    return ", ".join(f"{part} {getattr(first, f'{part}_ms'):.0f} ms" for part in PARTS)


def _each(names: tuple[str, ...]) -> dict[str, SecondsHistogram]:
    return {n: SecondsHistogram(n, DELIVERY_BUCKETS) for n in names}
