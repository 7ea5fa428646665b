"""Audio codecs and streams: WAV and raw PCM16 (wav, re-exported here), G.711 u-law / A-law (g711),
the realtime wire formats (formats), a streaming resampler (resample, soxr), Silero VAD (vad,
onnxruntime), the thinker's log-mel features (log_mel, torch) and the front door that scores many
sessions' input audio in batches (front_door). Only the numpy-only WAV codec is
imported here, so importing the package loads none of soxr, onnxruntime or torch."""

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
