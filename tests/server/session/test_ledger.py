"""Truncation: the heard part of an assistant transcript."""

from __future__ import annotations

from omnivoice.server.session.ledger import MS_PER_CHAR, AudioLedger


def ledger(text: str, generated_s: float, sent_s: float, complete: bool) -> AudioLedger:
    led = AudioLedger(24000)
    led.add_text(text)
    led.generated, led.sent, led.complete = int(generated_s * 24000), int(sent_s * 24000), complete
    return led


def test_clamp() -> None:
    led = ledger("hello", 2.0, 1.5, True)
    assert (
        led.clamp(-5) == 0
        and led.clamp(10**9) == 1500
        and led.clamp(float("nan")) == 0
        and led.clamp(700.6) == 700
    )


def test_complete_audio_cuts_proportionally_on_a_word_boundary() -> None:
    led = ledger("one two three four", 4.0, 4.0, True)
    assert led.heard_transcript(0) == ""
    assert led.heard_transcript(2000) == "one two"  # cut at char 9 ("one two t|hree"): partial word dropped
    assert led.heard_transcript(4000) == "one two three four"


def test_cut_short_audio_uses_the_speaking_rate() -> None:
    text = "a" * 10 + " " + "b" * 89  # 100 chars: 7 s at MS_PER_CHAR, but only 1 s of audio was generated
    led = ledger(text, 1.0, 1.0, False)
    assert len(text) * MS_PER_CHAR == 7000
    assert led.heard_transcript(1000) == "a" * 10  # 1/7 of the text = 14 chars, cut back to a word
