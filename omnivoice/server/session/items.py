"""`conversation.item.create|retrieve|delete|truncate`."""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import TYPE_CHECKING, Any

import numpy as np
import soxr

from omnivoice.audio.formats import AudioFormat
from omnivoice.audio.wav import AudioDecodeError
from omnivoice.server.session import protocol as p
from omnivoice.server.session.conversation import INPUT_RATE, Content, Item, new_id
from omnivoice.types import text_exceeds

if TYPE_CHECKING:
    from omnivoice.server.session.session import Session

MIN_AUDIO_MS = 10  # an item's audio: the thinker's audio features have one frame per 10 ms
MIN_AUDIO_SAMPLES = INPUT_RATE * MIN_AUDIO_MS // 1000
_USER_TYPES = {"input_text", "input_audio"}
_ASSISTANT_TYPES = {
    "output_text": "output_text",
    "text": "output_text",
    "output_audio": "output_audio",
    "audio": "output_audio",
}


async def handle(session: Session, e: p.ClientEvent) -> None:
    if isinstance(e, p.ItemCreate):
        await create(session, e)
    elif isinstance(e, p.ItemRetrieve):
        item = _find(session, e.item_id, e.event_id)
        session.outbox.put({"type": "conversation.item.retrieved", "item": _with_audio(session, item)})
    elif isinstance(e, p.ItemDelete):
        item = _find(session, e.item_id, e.event_id)
        if session.response is not None and session.response.item is item:
            raise p.ProtocolError(
                "the item is being generated; cancel the response first",
                "invalid_value",
                "item_id",
                e.event_id,
            )
        session.conversation.delete(item.id)
        session.outbox.put({"type": "conversation.item.deleted", "item_id": item.id})
    elif isinstance(e, p.ItemTruncate):
        truncate(session, e)


def _find(session: Session, item_id: str, event_id: str | None) -> Item:
    item = session.conversation.get(item_id)
    if item is None:
        raise p.ProtocolError(
            f"the item with id {item_id!r} does not exist", "item_not_found", "item_id", event_id
        )
    return item


async def create(session: Session, e: p.ItemCreate) -> None:
    it = e.item
    if it.type != "message":
        raise p.ProtocolError(
            f"items of type {it.type!r} (function calling) are not supported",
            "unsupported",
            "item.type",
            e.event_id,
        )
    if it.role is None:
        raise p.ProtocolError(
            "Missing required parameter: 'item.role'.", "missing_required_parameter", "item.role", e.event_id
        )
    if not it.content:
        raise p.ProtocolError(
            "the item has no content", "missing_required_parameter", "item.content", e.event_id
        )
    texts = [t for c in it.content for t in (c.text, c.transcript) if t]
    if text_exceeds(texts, session.engine.info.max_prompt_chars):  # it could never be in a prompt
        raise too_long("item.content", sum(map(len, texts)), session, e.event_id)
    content = [
        await _content(session, it.role, c, f"item.content[{n}]", e.event_id)
        for n, c in enumerate(it.content)
    ]
    item = Item(it.id or new_id("item"), it.role, content)
    try:
        prev = session.conversation.insert(item, e.previous_item_id)
    except KeyError:
        raise p.ProtocolError(
            f"previous_item_id {e.previous_item_id!r} does not exist",
            "item_not_found",
            "previous_item_id",
            e.event_id,
        ) from None
    except ValueError:
        raise p.ProtocolError(
            f"an item with id {item.id!r} already exists", "invalid_value", "item.id", e.event_id
        ) from None
    session.outbox.put({"type": "conversation.item.added", "previous_item_id": prev, "item": item.wire()})
    session.outbox.put({"type": "conversation.item.done", "previous_item_id": prev, "item": item.wire()})


def too_long(param: str, chars: int, session: Session, event_id: str | None) -> p.ProtocolError:
    """The error for text no prompt can hold (`ModelInfo.max_prompt_chars`), refused before it is kept."""
    info = session.engine.info
    message = (
        f"Invalid '{param}': string too long. The model's context of {info.max_prompt_tokens} tokens "
        f"holds at most {info.max_prompt_chars} characters, got {chars}."
    )
    return p.ProtocolError(message, "string_above_max_length", param, event_id)


async def _content(
    session: Session, role: str, c: p.ContentParam, param: str, event_id: str | None
) -> Content:
    allowed = _USER_TYPES if role == "user" else {"input_text"} if role == "system" else set(_ASSISTANT_TYPES)
    if c.type not in allowed:
        raise p.ProtocolError(
            f"content of type {c.type!r} is not allowed in a {role} item",
            "invalid_value",
            f"{param}.type",
            event_id,
        )
    if c.type == "input_text":
        if c.text is None:
            raise p.ProtocolError(
                f"Missing required parameter: '{param}.text'.",
                "missing_required_parameter",
                f"{param}.text",
                event_id,
            )
        return Content("input_text", text=c.text)
    if c.type == "input_audio":
        if c.audio is None and c.transcript is None:
            raise p.ProtocolError(
                f"Missing required parameter: '{param}.audio'.",
                "missing_required_parameter",
                f"{param}.audio",
                event_id,
            )
        audio = None
        if c.audio:  # decoding and resampling are CPU work in proportion to the audio: off the loop
            fmt, max_s = session.settings.input_format, session.buffer.max_samples / INPUT_RATE
            audio = await asyncio.to_thread(_decode_audio, fmt, max_s, c.audio, f"{param}.audio", event_id)
        return Content("input_audio", audio=audio, transcript=c.transcript)
    kind = _ASSISTANT_TYPES[c.type]
    if kind == "output_text":
        return Content("output_text", text=c.text or "")
    return Content("output_audio", transcript=c.transcript or c.text or "")


def _decode_audio(
    fmt: AudioFormat, max_seconds: float, data: str, param: str, event_id: str | None
) -> np.ndarray:
    try:
        pcm = fmt.decode(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError) as err:
        message = str(err) if isinstance(err, AudioDecodeError) else "the audio is not valid base64"
        raise p.ProtocolError(message, "invalid_value", param, event_id) from None
    if pcm.size / fmt.sample_rate > max_seconds:
        raise p.ProtocolError(
            "the audio is longer than the input buffer's limit",
            "input_audio_buffer_too_large",
            param,
            event_id,
        )
    audio = soxr.resample(pcm, fmt.sample_rate, INPUT_RATE).astype(np.float32, copy=False)
    if audio.size < MIN_AUDIO_SAMPLES:  # kept, it would fail every later response's prompt
        message = f"the audio is shorter than {MIN_AUDIO_MS} ms"
        raise p.ProtocolError(message, "invalid_value", param, event_id)
    return audio


def _with_audio(session: Session, item: Item) -> dict[str, Any]:
    """The item as `conversation.item.retrieved` shows it: input audio included, in the input format."""
    wire = item.wire()
    fmt = session.settings.input_format
    for c, w in zip(item.content, wire["content"], strict=True):
        if c.audio is not None:
            pcm = soxr.resample(c.audio, INPUT_RATE, fmt.sample_rate).astype(np.float32, copy=False)
            w["audio"] = base64.b64encode(fmt.encode(pcm)).decode("ascii")
    return wire


def truncate(session: Session, e: p.ItemTruncate) -> None:
    item = _find(session, e.item_id, e.event_id)
    if item.role != "assistant" or item.ledger is None:
        raise p.ProtocolError(
            "only assistant audio items can be truncated", "invalid_value", "item_id", e.event_id
        )
    if e.content_index != 0:
        raise p.ProtocolError("content_index must be 0", "invalid_value", "content_index", e.event_id)
    if session.response is not None and session.response.item is item:
        # still being generated: apply once the response ends, against the audio that was really sent
        session.defer_truncate(item.id, e.audio_end_ms)
        return
    apply_truncate(session, item, e.audio_end_ms)


def apply_truncate(session: Session, item: Item, audio_end_ms: float) -> None:
    """Keep only the heard part of the transcript in the history; `audio_end_ms` is clamped."""
    ledger = item.ledger
    assert ledger is not None
    heard = ledger.clamp(audio_end_ms)
    item.content[0].transcript = ledger.heard_transcript(heard)
    ledger.sent = min(ledger.sent, heard * ledger.sample_rate // 1000)
    session.outbox.put(
        {"type": "conversation.item.truncated", "item_id": item.id, "content_index": 0, "audio_end_ms": heard}
    )
