"""Request bodies the tests send again and again."""

from __future__ import annotations

from typing import Any


def streamed_audio_chat(frames: int, tokens: int = 16) -> dict[str, Any]:
    """A streamed chat request for text and audio of fixed lengths: `tokens` text tokens, `frames` codec
    frames (80 ms each)."""
    return {
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "pcm16"},
        "max_tokens": tokens,
        "min_tokens": tokens,
        "min_audio_frames": frames,
        "max_audio_frames": frames,
    }
