"""What was said and sent for one assistant item, so a truncate can drop the part the user never heard."""

from __future__ import annotations

import re

# Speaking rate used to place text in audio that was never generated (a cancelled response: the
# thinker runs ahead of the talker, so the text is longer than the audio). English TTS runs ~14
# characters per second.
MS_PER_CHAR = 70.0
_WORD_END = re.compile(r"\s+\S*$")


class AudioLedger:
    """Audio generated and sent for one assistant item (in samples at `sample_rate`) and its transcript."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.generated = 0
        self.sent = 0
        self.transcript = ""
        self.complete = False  # all the item's audio was generated (not cut short)

    def add_text(self, text: str) -> None:
        self.transcript += text

    @property
    def sent_ms(self) -> int:
        return int(1000 * self.sent / self.sample_rate)

    def clamp(self, audio_end_ms: float) -> int:
        """`audio_end_ms` clamped to what was actually sent (clients often overshoot or send junk)."""
        if audio_end_ms != audio_end_ms:  # NaN
            return 0
        return int(max(0, min(audio_end_ms, self.sent_ms)))

    def heard_transcript(self, heard_ms: int) -> str:
        """The transcript up to what `heard_ms` of audio said.

        The cut is proportional to time: over the whole audio when it was all generated, else over
        an estimate of the full audio's length from the text at MS_PER_CHAR. A partly heard word is
        dropped.
        """
        text = self.transcript
        if not text or heard_ms <= 0:
            return ""
        generated_ms = 1000 * self.generated / self.sample_rate
        total_ms = generated_ms if self.complete else max(generated_ms, len(text) * MS_PER_CHAR)
        if total_ms <= 0 or heard_ms >= total_ms:
            return text
        cut = round(len(text) * heard_ms / total_ms)
        if cut >= len(text):
            return text
        head = text[:cut]
        if not text[cut].isspace():
            head = _WORD_END.sub("", head) if _WORD_END.search(head) else ""
        return head.rstrip()
