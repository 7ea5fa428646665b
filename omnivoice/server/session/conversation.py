"""The conversation of one session: ordered items, and the chat history they feed the thinker.

User audio is kept as 16 kHz float32 PCM and replayed to the thinker as audio on every turn, with
its log-mel features, computed once (`prompting.featurize`), a user image as its encoded file (decoded
only while a prompt is built);
assistant turns are replayed as their (possibly truncated) transcript. A `function_call` item is a
call the model made (or the client added), a `function_call_output` item the result the client
sends back for it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from omnivoice.audio.log_mel import LogMelStream
from omnivoice.server.session.ledger import AudioLedger
from omnivoice.types import AudioPart, ChatMessage, ImagePart, TextPart, ToolCall

INPUT_RATE = 16000  # the thinker's audio encoder rate; user audio is stored at it


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class Content:
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]
    text: str | None = None
    audio: np.ndarray | None = None  # input_audio: 16 kHz float32
    transcript: str | None = None
    features: np.ndarray | None = None  # input_audio: its log-mel features, once computed
    stream: LogMelStream | None = None  # input_audio spoken: its features computed while it was spoken
    image: ImagePart | None = None  # input_image: the encoded file and its size
    image_url: str | None = None  # input_image: the data URL as sent (shown by item.retrieve only)
    detail: str | None = None

    def wire(self) -> dict[str, Any]:
        if self.type in ("input_text", "output_text"):
            return {"type": self.type, "text": self.text or ""}
        if self.type == "input_image":  # the image's data is left out of item events: it can be large
            return {"type": self.type, "detail": self.detail or "auto"}
        return {"type": self.type, "transcript": self.transcript}


@dataclass
class Item:
    """A message (`role`, `content`), or a function call (role assistant: `call_id`, `name`,
    `arguments`, the JSON text of the arguments) or its output (role tool: `call_id`, `output`)."""

    id: str
    role: Literal["user", "assistant", "system", "tool"]
    content: list[Content] = field(default_factory=list)
    status: Literal["completed", "in_progress", "incomplete"] = "completed"
    ledger: AudioLedger | None = None  # assistant audio items
    type: Literal["message", "function_call", "function_call_output"] = "message"
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""
    output: str = ""

    def wire(self) -> dict[str, Any]:
        head = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        if self.type == "function_call":
            return {**head, "call_id": self.call_id, "name": self.name, "arguments": self.arguments}
        if self.type == "function_call_output":
            return {**head, "call_id": self.call_id, "output": self.output}
        return {**head, "role": self.role, "content": [c.wire() for c in self.content]}

    def message(self) -> ChatMessage | None:
        """This item as a thinker chat message; None when it has nothing to say."""
        if self.type == "function_call_output":
            return ChatMessage("tool", (TextPart(self.output),), tool_call_id=self.call_id)
        if self.type == "function_call":
            call = ToolCall(self.call_id or "", self.name or "", self.arguments)
            return ChatMessage("assistant", (), tool_calls=(call,))
        parts: list[TextPart | AudioPart | ImagePart] = []
        for c in self.content:
            if c.type == "input_image" and c.image is not None:
                parts.append(c.image)
            elif c.type == "input_audio" and c.audio is not None and c.audio.size:
                parts.append(AudioPart(c.audio, INPUT_RATE, c.features))
            elif c.type == "input_audio" and c.transcript:
                parts.append(TextPart(c.transcript))
            elif c.text or c.transcript:
                parts.append(TextPart(c.text or c.transcript or ""))
        return ChatMessage(self.role, tuple(parts)) if parts else None

    @property
    def image_pixels(self) -> int:
        """Pixels of its input images (width x height each)."""
        return sum(c.image.shape[0] * c.image.shape[1] for c in self.content if c.image is not None)

    @property
    def audio_seconds(self) -> float:
        return sum(c.audio.size for c in self.content if c.audio is not None) / INPUT_RATE


class ConversationFull(ValueError):
    """The conversation holds its most items; the client must delete some before adding more."""


class Conversation:
    """Items in order, by id; at most `max_items` of them (None: no limit).

    Past the limit an item the client adds is refused (`insert(strict=True)`: ConversationFull), while
    one the server adds (a turn, a response) makes room by dropping the oldest item, whose id is
    handed to `on_evict` (the session tells the client)."""

    def __init__(self, max_items: int | None = None, on_evict: Callable[[str], None] | None = None) -> None:
        self.items: list[Item] = []
        self.featurizing = asyncio.Lock()  # held while its audio's features are computed
        self.max_items = max_items
        self._on_evict = on_evict

    def get(self, item_id: str) -> Item | None:
        return next((i for i in self.items if i.id == item_id), None)

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def insert(self, item: Item, previous_item_id: str | None = None, strict: bool = False) -> str | None:
        """Insert after `previous_item_id` ("root" for the start), else at the end; returns the previous id.

        Raises KeyError when `previous_item_id` names no item, ValueError when `item.id` is taken,
        ConversationFull when `strict` and the conversation holds `max_items` (without `strict` the
        oldest items are dropped to make room).
        """
        if self.get(item.id) is not None:
            raise ValueError(item.id)
        if self.max_items is not None and len(self.items) >= self.max_items:
            if strict:
                raise ConversationFull(f"the conversation holds its limit of {self.max_items} items")
            self._evict(len(self.items) - self.max_items + 1)
        if previous_item_id is None:
            prev = self.last_id()
            self.items.append(item)
            return prev
        if previous_item_id == "root":
            self.items.insert(0, item)
            return None
        index = next((n for n, i in enumerate(self.items) if i.id == previous_item_id), None)
        if index is None:
            raise KeyError(previous_item_id)
        self.items.insert(index + 1, item)
        return previous_item_id

    def _evict(self, count: int) -> None:
        gone, self.items = self.items[:count], self.items[count:]
        for old in gone:
            if self._on_evict is not None:
                self._on_evict(old.id)

    def snapshot(self) -> Conversation:
        """A copy of the item list (the items themselves are shared), to read off the event loop."""
        out = Conversation()
        out.items = list(self.items)
        return out

    def extended(self, item: Item) -> Conversation:
        """A copy with `item` appended (the items themselves are shared); this one is unchanged."""
        out = Conversation()
        out.items = [*self.items, item]
        out.featurizing = self.featurizing  # the same items: featurized under the same lock
        return out

    def delete(self, item_id: str) -> bool:
        before = len(self.items)
        self.items = [i for i in self.items if i.id != item_id]
        return len(self.items) < before

    def messages(self, instructions: str | None, skip_oldest: int = 0) -> list[ChatMessage]:
        """The history as chat messages, without its `skip_oldest` oldest items; instructions first.

        Function calls join the assistant turn just before them (the turn that made them, as the chat
        template writes it); a function's output whose call is not in the history is left out."""
        out: list[ChatMessage] = []
        calls: set[str | None] = set()
        for item in self.items[skip_oldest:]:
            m = item.message()
            if m is None or (m.role == "tool" and m.tool_call_id not in calls):
                continue
            calls.update(c.id for c in m.tool_calls)
            if m.tool_calls and out and out[-1].role == "assistant":
                out[-1] = replace(out[-1], tool_calls=(*out[-1].tool_calls, *m.tool_calls))
            else:
                out.append(m)
        if instructions:
            out.insert(0, ChatMessage("system", (TextPart(instructions),)))
        return out
