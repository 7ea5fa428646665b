"""/metrics of how the server delivers the realtime responses' audio (session/delivery.py), read at
scrape time: each response's time to its first text and audio delta, where its engine request's time
to its first audio went, and its playback underrun."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from omnivoice.server.metrics import ScrapedCollector, histogram_family, seconds_family
from omnivoice.server.session.delivery import DeliveryStats


class DeliveryCollector(ScrapedCollector[DeliveryStats]):
    def collect(self) -> Iterator[Metric]:
        s = self._source
        yield seconds_family(
            "omnivoice_realtime_response_seconds",
            "A realtime response's start (its turn's end) to its first text or audio delta queued",
            "phase",
            s.phases.values(),
        )
        yield seconds_family(
            "omnivoice_realtime_engine_first_audio_seconds",
            "A realtime response's engine request, from its start to its first audio, part by part "
            "(thinker to the first token, to the talker, talker frames, to Code2Wav, decode, to the engine)",
            "part",
            s.parts.values(),
        )
        u = s.underrun
        yield histogram_family(
            "omnivoice_realtime_playback_underrun_seconds",
            "Seconds a player of a realtime response's audio would have waited, as the server sent it",
            u.bounds,
            u.counts,
            u.total,
            u.sum_s,
        )
