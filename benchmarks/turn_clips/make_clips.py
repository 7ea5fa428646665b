"""Make the end-of-turn benchmark's clips with espeak-ng and sox: complete questions, and questions
broken by a 400-900 ms pause mid-sentence (an SSML <break> inside one utterance, so the words before
the pause are spoken as the start of a longer sentence). 16 kHz mono pcm16 WAVs, leading and trailing
silence trimmed, and `clips.json`: per clip its text, and for a broken one the pause asked for and
where it lies (samples), measured on the WAV.

    python benchmarks/turn_clips/make_clips.py [--out benchmarks/turn_clips]

espeak-ng's output differs a little between its releases: the clips in the repo were made with 1.51.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from omnivoice.audio.wav import decode_wav

RATE = 16000
VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb+m3")
COMPLETE = (
    "What time does the museum open tomorrow?",
    "Can you recommend a good restaurant nearby?",
    "Please set an alarm for seven in the morning.",
    "How far is the airport from the city centre?",
    "What is the weather going to be like this weekend?",
    "How do I reset my password?",
    "Which train goes to the central station?",
    "Tell me a joke about cats.",
)
BROKEN = (  # (before the pause, pause ms, after it)
    ("I would like to book", 600, "a table for two tonight."),
    ("Can you tell me how to get to", 450, "the nearest pharmacy?"),
    ("What is the best way to", 800, "learn a new language?"),
    ("Could you remind me to", 700, "call my mother at five?"),
    ("I need a flight from London to", 900, "Paris on Friday."),
    ("How many days are there in", 400, "a leap year?"),
    ("Please play some music by", 550, "a jazz pianist."),
    ("What should I cook for", 750, "dinner with my friends?"),
)
QUIET = 0.01  # |sample| below this is silence when measuring the pause


def synthesize(ssml: str, voice: str, out: Path) -> np.ndarray:
    """`ssml` spoken by espeak-ng in `voice`, as 16 kHz mono pcm16 with its edges' silence trimmed."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(
            ["espeak-ng", "-m", "-v", voice, "-w", str(raw), ssml], check=True, capture_output=True
        )
        trim = ["silence", "1", "0.01", "0.5%", "reverse", "silence", "1", "0.01", "0.5%", "reverse"]
        subprocess.run(
            ["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(out), *trim],
            check=True,
            capture_output=True,
        )
    pcm, rate = decode_wav(out.read_bytes())
    assert rate == RATE
    return pcm


def longest_quiet(pcm: np.ndarray) -> tuple[int, int]:
    """[start, end) of the longest run of quiet samples inside the clip: the pause."""
    loud = np.flatnonzero(np.abs(pcm) >= QUIET)
    k = int(np.argmax(np.diff(loud)))
    return int(loud[k]) + 1, int(loud[k + 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    out: Path = parser.parse_args().out
    clips = []
    for i, text in enumerate(COMPLETE):
        name = f"complete/{i:02d}.wav"
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        pcm = synthesize(f"<speak>{text}</speak>", VOICES[i % len(VOICES)], out / name)
        clips.append({"file": name, "kind": "complete", "text": text, "samples": int(pcm.size)})
    for i, (head, pause_ms, tail) in enumerate(BROKEN):
        name = f"broken/{i:02d}.wav"
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        ssml = f'<speak>{head} <break time="{pause_ms}ms"/> {tail}</speak>'
        pcm = synthesize(ssml, VOICES[i % len(VOICES)], out / name)
        start, end = longest_quiet(pcm)
        clips.append(
            {
                "file": name,
                "kind": "broken",
                "text": f"{head} ... {tail}",
                "samples": int(pcm.size),
                "pause_ms": pause_ms,
                "pause": [start, end],
            }
        )
    manifest = {"rate": RATE, "made_with": "espeak-ng 1.51, sox", "clips": clips}
    (out / "clips.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
