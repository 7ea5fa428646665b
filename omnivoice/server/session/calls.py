"""The function calls of one response, as output items: each call the engine parses from the thinker's
text becomes a `function_call` item, streamed as the GA protocol has it:

    response.output_item.added {item: {type: function_call, call_id, name, arguments: ""}}
    response.function_call_arguments.delta {item_id, call_id, output_index, delta}   (as written)
    response.function_call_arguments.done {item_id, call_id, name, arguments}
    response.output_item.done {item}

and added to the conversation (`conversation.item.added` / `.done`) unless the response is out of
band. A call the response ended inside (cancelled, failed, cut at its token limit) or that the model
wrote wrong is closed the same way, with what was written and status `incomplete`.
"""

from __future__ import annotations

import logging
from typing import Any

from omnivoice.server.session.conversation import Conversation, Item, new_id
from omnivoice.server.session.outbox import Outbox
from omnivoice.types import ToolCallDelta, ToolCallDone

log = logging.getLogger(__name__)


class ResponseCalls:
    """The calls of response `response_id`; its output items (`outputs`, shared with the response,
    in output order) gain one per call. `conversation` is None for a response out of band."""

    def __init__(
        self, response_id: str, outbox: Outbox, conversation: Conversation | None, outputs: list[Item]
    ) -> None:
        self._response_id = response_id
        self._outbox = outbox
        self._conversation = conversation
        self._outputs = outputs
        self._open: dict[int, Item] = {}  # the engine's call index -> its item, until done
        self._output_index: dict[str, int] = {}  # item id -> its place among the response's outputs

    def delta(self, d: ToolCallDelta) -> None:
        """A piece of call `d.index`: its start (id and name), or more of its arguments."""
        item = self._open.get(d.index)
        if item is None:
            item = self._start(d.index, d.call_id, d.name or "")
        if d.arguments:
            item.arguments += d.arguments
            event = {"type": "response.function_call_arguments.delta", **self._where(item)}
            self._outbox.put({**event, "delta": d.arguments})

    def done(self, d: ToolCallDone) -> None:
        """Call `d.index` is written: its item holds the call as parsed."""
        item = self._open.get(d.index) or self._start(d.index, d.call.id, d.call.name)
        item.name, item.arguments = d.call.name, d.call.arguments
        if d.error is not None:
            log.info("response %s: call %s is not a valid call: %s", self._response_id, d.call.id, d.error)
        self._close(d.index, "completed" if d.error is None else "incomplete")

    def close(self) -> None:
        """The response ended: calls still open close with what was written, `incomplete`."""
        for index in list(self._open):
            self._close(index, "incomplete")

    def _start(self, index: int, call_id: str, name: str) -> Item:
        item = Item(new_id("item"), "assistant", status="in_progress", type="function_call")
        item.call_id, item.name = call_id, name
        self._open[index] = item
        output_index = self._output_index[item.id] = len(self._outputs)
        self._outputs.append(item)
        ids = {"response_id": self._response_id, "output_index": output_index}
        self._outbox.put({"type": "response.output_item.added", **ids, "item": item.wire()})
        if self._conversation is not None:
            prev = self._conversation.insert(item)
            self._outbox.put(
                {"type": "conversation.item.added", "previous_item_id": prev, "item": item.wire()}
            )
        return item

    def _close(self, index: int, status: str) -> None:
        item = self._open.pop(index)
        item.status = "completed" if status == "completed" else "incomplete"
        where = self._where(item)
        self._outbox.put(
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": item.name,
                "arguments": item.arguments,
            }
        )
        ids = {"response_id": self._response_id, "output_index": where["output_index"]}
        self._outbox.put({"type": "response.output_item.done", **ids, "item": item.wire()})
        if self._conversation is not None and self._conversation.get(item.id) is not None:
            self._outbox.put({"type": "conversation.item.done", "item": item.wire()})

    def _where(self, item: Item) -> dict[str, Any]:
        return {
            "response_id": self._response_id,
            "item_id": item.id,
            "output_index": self._output_index[item.id],
            "call_id": item.call_id,
        }
