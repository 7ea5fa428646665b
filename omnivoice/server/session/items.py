"""`conversation.item.create|retrieve|delete|truncate`: the client edits the conversation.

Each helper takes the pieces it acts on (the conversation, the outbox, the model's limits, the input
format); the session dispatches the events and decides when a truncate applies (session.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from typing import Any

import numpy as np
import soxr

from omnivoice.audio.formats import AudioFormat
from omnivoice.audio.wav import AudioDecodeError
from omnivoice.server.image_data import ImageDecodeError, read_image_url
from omnivoice.server.session import protocol as p
from omnivoice.server.session.conversation import (
    INPUT_RATE,
    Content,
    Conversation,
    ConversationFull,
    Item,
    new_id,
)
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.tools import FUNCTION_NAME
from omnivoice.types import ModelInfo, text_exceeds

# an item's audio: the features' first frame (10 ms apart) reads 200 samples either side of its centre
MIN_AUDIO_MS = 13
MIN_AUDIO_SAMPLES = INPUT_RATE * MIN_AUDIO_MS // 1000
_USER_TYPES = {"input_text", "input_audio", "input_image"}
_ASSISTANT_TYPES = {
    "output_text": "output_text",
    "text": "output_text",
    "output_audio": "output_audio",
    "audio": "output_audio",
}


def find(conversation: Conversation, item_id: str, event_id: str | None) -> Item:
    """The item `item_id`, or ProtocolError `item_not_found`."""
    item = conversation.get(item_id)
    if item is None:
        raise p.ProtocolError(
            f"the item with id {item_id!r} does not exist", "item_not_found", "item_id", event_id
        )
    return item


async def create(
    e: p.ItemCreate,
    conversation: Conversation,
    outbox: Outbox,
    info: ModelInfo,
    input_format: AudioFormat,
    max_audio_s: float,
    image_pixels: tuple[int, int],
) -> None:
    """Add the client's item; its audio is in `input_format`, at most `max_audio_s` long; its images
    of at most `image_pixels[0]` pixels each, the conversation's of at most `image_pixels[1]` in all.
    The conversation holds at most its `max_items` (conversation_full past it)."""
    it = e.item
    full = conversation.max_items is not None and len(conversation.items) >= conversation.max_items
    if full:  # refused before its content is decoded
        message = f"the conversation holds its limit of {conversation.max_items} items; delete some first"
        raise p.ProtocolError(message, "conversation_full", "item", e.event_id)
    if it.type != "message":
        item = function_item(e, conversation, info)
    else:
        item = await _message(e, info, input_format, max_audio_s, image_pixels[0])
    held = sum(i.image_pixels for i in conversation.items)
    if item.image_pixels and held + item.image_pixels > image_pixels[1]:
        message = (
            f"the conversation's images would hold {held + item.image_pixels} pixels; the limit is "
            f"{image_pixels[1]} (realtime.max_session_image_pixels): delete some image items first"
        )
        raise p.ProtocolError(message, "image_budget_exceeded", "item.content", e.event_id)
    try:
        prev = conversation.insert(item, e.previous_item_id, strict=True)
    except KeyError:
        raise p.ProtocolError(
            f"previous_item_id {e.previous_item_id!r} does not exist",
            "item_not_found",
            "previous_item_id",
            e.event_id,
        ) from None
    except ConversationFull as err:
        raise p.ProtocolError(str(err), "conversation_full", "item", e.event_id) from None
    except ValueError:
        raise p.ProtocolError(
            f"an item with id {item.id!r} already exists", "invalid_value", "item.id", e.event_id
        ) from None
    outbox.put({"type": "conversation.item.added", "previous_item_id": prev, "item": item.wire()})
    outbox.put({"type": "conversation.item.done", "previous_item_id": prev, "item": item.wire()})


async def _message(
    e: p.ItemCreate, info: ModelInfo, input_format: AudioFormat, max_audio_s: float, max_image_pixels: int
) -> Item:
    it = e.item
    if it.role is None:
        raise p.ProtocolError(
            "Missing required parameter: 'item.role'.", "missing_required_parameter", "item.role", e.event_id
        )
    if not it.content:
        raise p.ProtocolError(
            "the item has no content", "missing_required_parameter", "item.content", e.event_id
        )
    texts = [t for c in it.content for t in (c.text, c.transcript) if t]
    if text_exceeds(texts, info.max_prompt_chars):  # it could never be in a prompt
        raise p.too_long("item.content", sum(map(len, texts)), info, e.event_id)
    content = [
        await _content(
            it.role, c, (input_format, max_audio_s, max_image_pixels), f"item.content[{n}]", e.event_id
        )
        for n, c in enumerate(it.content)
    ]
    return Item(it.id or new_id("item"), it.role, content)


def function_item(e: p.ItemCreate, conversation: Conversation, info: ModelInfo) -> Item:
    """A `function_call` item (a call the client says the model made) or a `function_call_output`
    item (the result of a call in the conversation), checked (ProtocolError naming the field)."""
    it, event_id = e.item, e.event_id
    if it.content or it.role is not None:
        field = "content" if it.content else "role"
        message = f"an item of type {it.type!r} has no {field}"
        raise p.ProtocolError(message, "invalid_value", f"item.{field}", event_id)
    texts = [it.name or "", it.arguments or "", it.output or ""]
    if text_exceeds(texts, info.max_prompt_chars):
        raise p.too_long("item", sum(map(len, texts)), info, event_id)
    item_id = it.id or new_id("item")
    if it.type == "function_call":
        if not it.name or not re.fullmatch(FUNCTION_NAME, it.name):
            raise p.ProtocolError(
                "a function_call needs the function's name", "invalid_value", "item.name", event_id
            )
        arguments = it.arguments or "{}"
        if not _json_object(arguments):
            message = "item.arguments must be the JSON text of the arguments object"
            raise p.ProtocolError(message, "invalid_value", "item.arguments", event_id)
        call_id = it.call_id or new_id("call")
        return Item(
            item_id, "assistant", type="function_call", call_id=call_id, name=it.name, arguments=arguments
        )
    if it.call_id is None or it.output is None:
        field = "call_id" if it.call_id is None else "output"
        raise p.ProtocolError(
            f"Missing required parameter: 'item.{field}'.",
            "missing_required_parameter",
            f"item.{field}",
            event_id,
        )
    if not any(i.type == "function_call" and i.call_id == it.call_id for i in conversation.items):
        message = f"call_id {it.call_id!r} names no function_call item in the conversation"
        raise p.ProtocolError(message, "invalid_value", "item.call_id", event_id)
    return Item(item_id, "tool", type="function_call_output", call_id=it.call_id, output=it.output)


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


async def _content(
    role: str, c: p.ContentParam, limits: tuple[AudioFormat, float, int], param: str, event_id: str | None
) -> Content:
    """One part of a message item; `limits`: the input audio format, the longest audio (seconds) and
    the largest image (pixels)."""
    fmt, max_s, max_pixels = limits
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
            audio = await asyncio.to_thread(_decode_audio, fmt, max_s, c.audio, f"{param}.audio", event_id)
        return Content("input_audio", audio=audio, transcript=c.transcript)
    if c.type == "input_image":
        return await _image(c, max_pixels, param, event_id)
    kind = _ASSISTANT_TYPES[c.type]
    if kind == "output_text":
        return Content("output_text", text=c.text or "")
    return Content("output_audio", transcript=c.transcript or c.text or "")


async def _image(c: p.ContentParam, max_pixels: int, param: str, event_id: str | None) -> Content:
    if c.image_url is None:
        raise p.ProtocolError(
            f"Missing required parameter: '{param}.image_url'.",
            "missing_required_parameter",
            f"{param}.image_url",
            event_id,
        )
    try:  # base64 and the header's checksums are CPU work in proportion to the file: off the loop
        image = await asyncio.to_thread(read_image_url, c.image_url, max_pixels)
    except ImageDecodeError as err:
        raise p.ProtocolError(str(err), "invalid_value", f"{param}.image_url", event_id) from None
    return Content("input_image", image=image, image_url=c.image_url, detail=c.detail)


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


def retrieved(item: Item, fmt: AudioFormat) -> dict[str, Any]:
    """The item as `conversation.item.retrieved` shows it: input audio included, in the input format,
    and input images' data URLs."""
    wire = item.wire()
    for c, w in zip(item.content, wire.get("content", ()), strict=True):
        if c.image_url is not None:
            w["image_url"] = c.image_url
        if c.audio is not None:
            pcm = soxr.resample(c.audio, INPUT_RATE, fmt.sample_rate).astype(np.float32, copy=False)
            w["audio"] = base64.b64encode(fmt.encode(pcm)).decode("ascii")
    return wire


def announce_deleted(outbox: Outbox, item_id: str) -> None:
    """Tell the client an item left the conversation."""
    outbox.put({"type": "conversation.item.deleted", "item_id": item_id})


def delete(e: p.ItemDelete, conversation: Conversation, outbox: Outbox, generating: list[Item]) -> None:
    """Delete the item, unless it is one the in-flight response is `generating`."""
    item = find(conversation, e.item_id, e.event_id)
    if any(item is g for g in generating):
        raise p.ProtocolError(
            "the item is being generated; cancel the response first", "invalid_value", "item_id", e.event_id
        )
    conversation.delete(item.id)
    announce_deleted(outbox, item.id)


def truncatable(e: p.ItemTruncate, conversation: Conversation) -> Item:
    """The item a truncate names, if it is an assistant audio item (else ProtocolError)."""
    item = find(conversation, e.item_id, e.event_id)
    if item.role != "assistant" or item.ledger is None:
        raise p.ProtocolError(
            "only assistant audio items can be truncated", "invalid_value", "item_id", e.event_id
        )
    if e.content_index != 0:
        raise p.ProtocolError("content_index must be 0", "invalid_value", "content_index", e.event_id)
    return item


def apply_truncate(outbox: Outbox, item: Item, audio_end_ms: float) -> None:
    """Keep only the heard part of the transcript in the history; `audio_end_ms` is clamped."""
    ledger = item.ledger
    assert ledger is not None
    heard = ledger.clamp(audio_end_ms)
    item.content[0].transcript = ledger.heard_transcript(heard)
    ledger.sent = min(ledger.sent, heard * ledger.sample_rate // 1000)
    outbox.put(
        {"type": "conversation.item.truncated", "item_id": item.id, "content_index": 0, "audio_end_ms": heard}
    )
