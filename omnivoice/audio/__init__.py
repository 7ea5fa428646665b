"""Audio helpers: WAV/PCM codecs for the HTTP layer (pure numpy, no native audio libraries)."""

from omnivoice.audio.wav import (
    AudioDecodeError,
    decode_base64_audio,
    decode_pcm16,
    decode_wav,
    encode_wav,
    pcm16_bytes,
)

__all__ = [
    "AudioDecodeError",
    "decode_base64_audio",
    "decode_pcm16",
    "decode_wav",
    "encode_wav",
    "pcm16_bytes",
]
