"""The content parts of a chat message (text, audio as `input_audio` or a WAV data URL, images as
`image_url` data URLs), and their conversion to engine parts: audio decoded and checked against the
server's length limit, images read (their header only: never decoded here) and checked against its
pixel limit."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnivoice.audio import AudioDecodeError, decode_base64_audio
from omnivoice.server.errors import bad_request
from omnivoice.server.image_data import ImageDecodeError, read_image_url
from omnivoice.types import AudioPart, ImagePart, TextPart


class Lenient(BaseModel):
    """The request's objects: frozen, keys that only describe the request tolerated."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class TextContent(Lenient):
    type: Literal["text"]
    text: str


class InputAudio(Lenient):
    data: str
    format: str = "wav"  # checked when decoding, so the error can list what is supported


class InputAudioContent(Lenient):
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURL(Lenient):
    url: str


class AudioURLContent(Lenient):
    """vLLM's `audio_url` part; only `data:audio/wav;base64,...` URLs (the server fetches nothing)."""

    type: Literal["audio_url"]
    audio_url: AudioURL


class ImageURL(Lenient):
    url: str  # `detail` is tolerated: the image processor decides the resolution


class ImageURLContent(Lenient):
    """OpenAI's `image_url` part; only base64 data URLs of PNG, JPEG or WebP (the server fetches nothing)."""

    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[
    TextContent | InputAudioContent | AudioURLContent | ImageURLContent, Field(discriminator="type")
]


def engine_part(
    p: ContentPart, where: str, max_audio_seconds: float, max_image_pixels: int
) -> TextPart | AudioPart | ImagePart:
    if isinstance(p, TextContent):
        return TextPart(p.text)
    if isinstance(p, ImageURLContent):
        return image_part(p.image_url.url, f"{where}.image_url.url", max_image_pixels)
    try:
        if isinstance(p, InputAudioContent):
            pcm, rate = decode_base64_audio(p.input_audio.data, p.input_audio.format)
        else:
            pcm, rate = decode_base64_audio(*parse_audio_data_url(p.audio_url.url))
    except AudioDecodeError as e:
        raise bad_request(f"{where}: {e}", param=where, code="invalid_audio") from None
    if pcm.size == 0:
        raise bad_request(f"{where}: the audio has no samples", param=where, code="invalid_audio")
    seconds = pcm.size / rate
    if seconds > max_audio_seconds:
        message = f"{where}: audio is {seconds:.1f} s long; the limit is {max_audio_seconds:g} s"
        raise bad_request(message, param=where, code="audio_too_long")
    return AudioPart(pcm=pcm, sample_rate=rate)


def image_part(url: str, where: str, max_pixels: int) -> ImagePart:
    """An image URL read to an engine part (encoded); a 400 naming `where` if it cannot be."""
    try:
        return read_image_url(url, max_pixels)
    except ImageDecodeError as e:
        raise bad_request(f"{where}: {e}", param=where, code="invalid_image") from None


def parse_audio_data_url(url: str) -> tuple[str, str]:
    """`data:audio/wav;base64,XXXX` -> (XXXX, "wav")."""
    head, sep, data = url.partition(",")
    if not (url.startswith("data:") and sep and head.endswith(";base64")):
        raise AudioDecodeError("audio_url must be a base64 data URL (data:audio/wav;base64,...)")
    mime = head[len("data:") : -len(";base64")].lower()
    if mime not in ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"):
        raise AudioDecodeError(f"unsupported audio_url type {mime!r}; send audio/wav")
    return data, "wav"
