"""The assistant message of one response: its output item, the text said, and the events of its one
content part (text, or audio with its transcript).

The message opens with `open()`, or on the first words `say` is given; whitespace said before it opens
(around function calls) is held, so a response that is only calls has no message. Its item joins the
response's outputs and, unless the response is out of band, the conversation.
"""

from __future__ import annotations

from typing import Any, Literal

from omnivoice.server.session.conversation import Content, Conversation, Item, new_id
from omnivoice.server.session.ledger import AudioLedger
from omnivoice.server.session.outbox import Outbox


class ResponseMessage:
    """`audio_rate`: the output format's rate for an audio message, None for a text one."""

    def __init__(
        self,
        response_id: str,
        outbox: Outbox,
        conversation: Conversation | None,
        outputs: list[Item],
        audio_rate: int | None,
    ) -> None:
        self._response_id = response_id
        self._outbox = outbox
        self._conversation = conversation
        self._outputs = outputs
        self._audio_rate = audio_rate
        self.item: Item | None = None
        self.transcript = ""  # all the text said, whatever was heard of it
        self._index = 0  # its output index
        self._pending = ""

    def open(self) -> Item:
        audio = self._audio_rate is not None
        kind: Literal["output_audio", "output_text"] = "output_audio" if audio else "output_text"
        content = Content(kind, transcript="" if audio else None, text=None)
        ledger = AudioLedger(self._audio_rate) if self._audio_rate is not None else None
        item = self.item = Item(new_id("item"), "assistant", [content], status="in_progress", ledger=ledger)
        self._index = len(self._outputs)
        self._outputs.append(item)
        ids = {"response_id": self._response_id, "output_index": self._index}
        self._outbox.put({"type": "response.output_item.added", **ids, "item": item.wire()})
        if self._conversation is not None:
            prev = self._conversation.insert(item)
            self._outbox.put(
                {"type": "conversation.item.added", "previous_item_id": prev, "item": item.wire()}
            )
        part = {"type": kind, "transcript": ""} if audio else {"type": kind, "text": ""}
        self._outbox.put({"type": "response.content_part.added", **self.where(), "part": part})
        return item

    def where(self) -> dict[str, Any]:
        """The ids every event of its content carries."""
        assert self.item is not None
        return {
            "response_id": self._response_id,
            "item_id": self.item.id,
            "output_index": self._index,
            "content_index": 0,
        }

    def say(self, text: str) -> None:
        """More of the message's text: a transcript delta (audio) or a text delta."""
        if self.item is None:
            if not text.strip():  # whitespace around calls opens no message
                self._pending += text
                return
            self.open()
            text, self._pending = self._pending + text, ""
        assert self.item is not None
        self.transcript += text
        if self.item.ledger is not None:
            self.item.ledger.add_text(text)
        audio = self._audio_rate is not None
        kind = "response.output_audio_transcript.delta" if audio else "response.output_text.delta"
        self._outbox.put({"type": kind, **self.where(), "delta": text})

    def close(self, completed: bool) -> None:
        """The response ended: the content part and the item are done. An audio message keeps, in
        the conversation, the transcript of what was heard."""
        item = self.item
        if item is None:
            return
        content, where, said = item.content[0], self.where(), self.transcript
        item.status = "completed" if completed else "incomplete"
        if item.ledger is not None:
            ledger = item.ledger
            content.transcript = said if ledger.complete else ledger.heard_transcript(ledger.sent_ms)
            self._outbox.put({"type": "response.output_audio.done", **where})
            self._outbox.put({"type": "response.output_audio_transcript.done", **where, "transcript": said})
            part = {"type": "output_audio", "transcript": said}
        else:
            content.text = said
            self._outbox.put({"type": "response.output_text.done", **where, "text": said})
            part = {"type": "output_text", "text": said}
        self._outbox.put({"type": "response.content_part.done", **where, "part": part})
        ids = {"response_id": self._response_id, "output_index": self._index}
        self._outbox.put({"type": "response.output_item.done", **ids, "item": item.wire()})
        if self._conversation is not None:
            self._outbox.put({"type": "conversation.item.done", "item": item.wire()})
