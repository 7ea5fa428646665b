"""One response: build the prompt from the history, run the engine, stream the events, paced.

Audio deltas leave as soon as each Code2Wav chunk is decoded, cut into pieces of at most DELTA_MS,
and never more than `ahead_s` ahead of real-time playback, so a barge-in leaves little queued. An
engine failure does not wait behind the paced audio (`ReadAhead`): the response fails at once and
its audio not yet sent is dropped.
Cancelling the response's task aborts the engine request in every stage (closing its iterator),
drops the deltas still queued, and ends the response with status `cancelled`.
A response may take over an engine request started before it (`EarlyStart`: a speculative start,
speculation.py) instead of starting its own; what that request made so far is streamed first.

A response's output items come in the order they start: the assistant message (its text and audio,
message.py) and, when it offers functions, a `function_call` item per call (calls.py). With functions
offered the message opens once the model says something, so a response that is only calls has no
message and no audio.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from omnivoice.audio.resample import StreamResampler
from omnivoice.engine.api import EngineAPI
from omnivoice.server.session.calls import ResponseCalls
from omnivoice.server.session.conversation import Conversation, Item, new_id
from omnivoice.server.session.delivery import DeliveryStats, parts_text
from omnivoice.server.session.generation import EarlyStart, ResponsePlan, start_generation
from omnivoice.server.session.ledger import AudioLedger
from omnivoice.server.session.message import ResponseMessage
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.pacing import Pacer
from omnivoice.server.session.server_events import error, format_object, usage_object
from omnivoice.types import (
    AudioChunk,
    ChatMessage,
    EngineOverloaded,
    EngineUnavailable,
    Finished,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)

log = logging.getLogger(__name__)

DELTA_MS = 200
AUDIO_DELTA = "response.output_audio.delta"


class Response:
    def __init__(
        self,
        *,
        session_id: str,
        engine: EngineAPI,
        outbox: Outbox,
        conversation: Conversation,
        plan: ResponsePlan,
        resampler: StreamResampler,
        ahead_s: float,
        on_done: Callable[[Response], None],
        early: EarlyStart | None = None,
        delivery: DeliveryStats | None = None,
    ) -> None:
        self.id = early.response_id if early is not None else new_id("resp")
        self.session_id = session_id
        self.plan = plan
        self.status = "in_progress"
        self.status_details: dict[str, Any] | None = None
        self.cancel_reason = "client_cancelled"
        self.messages: list[ChatMessage] = []  # the history this response was prompted with
        self.usage: Usage | None = None
        self.outputs: list[Item] = []  # every output item, in output order
        kept = conversation if plan.in_conversation else None
        rate = plan.output_format.sample_rate if plan.want_audio else None
        self._message = ResponseMessage(self.id, outbox, kept, self.outputs, rate)
        self._calls = ResponseCalls(self.id, outbox, kept, self.outputs)
        self._engine = engine
        self._outbox = outbox
        self._conversation = conversation
        self._resampler = resampler
        self._pacer = Pacer(ahead_s)
        # called once, then dropped: the session keeps its last response, and a response holding the
        # session's bound method would make a reference cycle that only the cyclic GC frees
        self._on_done: Callable[[Response], None] | None = on_done
        self._early = early
        self._delivery = delivery if delivery is not None else DeliveryStats()
        self._began = time.monotonic()
        self._said = self._sounded = False  # its first text / audio delta was queued
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"response-{self.id}")

    async def cancel(self, reason: str) -> None:
        """Cancel (if still running) and wait until `response.done` is queued."""
        self.cancel_reason = reason
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait([self.task])
            if self.task.cancelled():  # cancelled before its first step: `run` never ran, so end it here
                if self._early is not None:
                    await self._early.close()
                self._emit("response.created")
                self._cancelled()
                self._finish()

    async def run(self) -> None:
        self._emit("response.created")
        try:
            await self._generate()
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self._cancelled()
        except EngineOverloaded as e:  # refused at once: a full engine stage
            log.info("session %s: response %s refused: %s", self.session_id, self.id, e)
            self._fail("server_error", "server_overloaded", str(e))
            self._outbox.put(error(str(e), "server_overloaded", type_="server_error"))
        except EngineUnavailable as e:  # refused at once: the stages stopped (restarting, or not)
            log.info("session %s: response %s refused: %s", self.session_id, self.id, e)
            code = "engine_restarting" if self._engine.restarting else "engine_failed"
            self._fail("server_error", code, str(e))
            self._outbox.put(error(str(e), code, type_="server_error"))
        except Exception as e:
            failure = self._engine.failure
            if failure:  # a stage died meanwhile: the engine's refusal, not a fault of this server's
                code = "engine_restarting" if self._engine.restarting else "engine_failed"
                log.info("session %s: response %s failed: %s", self.session_id, self.id, failure)
                self._fail("server_error", code, f"the engine is unavailable: {failure}")
                self._outbox.put(error(f"the engine is unavailable: {failure}", code, type_="server_error"))
                return
            log.exception("session %s: response %s failed", self.session_id, self.id)
            self._fail("server_error", "internal_error", f"the response failed: {type(e).__name__}")
        finally:
            self._finish()

    def refuse(self, type_: str, code: str, message: str) -> None:
        """Refused before it started (the server's request limit): created, an error, done (failed)."""
        self._fail(type_, code, message)
        self._emit("response.created")
        self._outbox.put(error(message, code, type_=type_))
        self._emit("response.done")

    def _cancelled(self) -> None:
        self.status, self.status_details = "cancelled", {"type": "cancelled", "reason": self.cancel_reason}
        dropped = self._outbox.drop(
            lambda e: e.get("response_id") != self.id or not e["type"].endswith(".delta")
        )
        self._resampler.reset()
        log.info(
            "session %s: response %s cancelled (%s); %d queued deltas dropped",
            self.session_id, self.id, self.cancel_reason, dropped,
        )  # fmt: skip

    async def _generate(self) -> None:
        plan = self.plan
        started = await self._early.take() if self._early is not None else None
        if started is None:
            made = await start_generation(self._engine, self.id, self.session_id, plan, self._conversation)
            if isinstance(made, str):  # before the output item exists: a refused response adds nothing
                self._fail("invalid_request_error", "context_length_exceeded", made)
                return
            started = made
        self.messages = started.messages
        if started.request.tools is None:  # no call can come: the message opens at once
            self._message.open()
        ahead = started.ahead  # closing it early aborts the request in every stage
        try:
            async for out in ahead:
                if isinstance(out, TextDelta) and out.text:
                    self._message.say(out.text)
                    if not self._said:
                        self._said = True
                        self._delivery.reached("first_text", time.monotonic() - self._began)
                elif isinstance(out, ToolCallDelta):
                    self._calls.delta(out)
                elif isinstance(out, ToolCallDone):
                    self._calls.done(out)
                elif isinstance(out, AudioChunk) and plan.want_audio and out.pcm.size:
                    if out.first_audio is not None:
                        self._delivery.engine_first_audio(out.first_audio)
                        log.info(
                            "session %s: response %s: the engine's first audio %.0f ms after the response "
                            "began; its wait from the request's start: %s",
                            self.session_id, self.id, 1e3 * (time.monotonic() - self._began),
                            parts_text(out.first_audio),
                        )  # fmt: skip
                    if self.item is None:
                        self._message.open()
                    await self._send_audio(self._resampler.process(out.pcm), ahead.failed)
                elif isinstance(out, Finished):
                    self.usage = out.usage
                    self._on_finished(out)
        finally:
            await ahead.aclose()
        ended = self.status in ("completed", "incomplete")  # generation ran to its end (stop or length)
        if plan.want_audio and ended and self.item is not None:
            await self._send_audio(self._resampler.flush(), asyncio.Event())
        if self.item is not None and self.item.ledger is not None:
            self.item.ledger.complete = ended

    async def _send_audio(self, pcm: np.ndarray, stop: asyncio.Event) -> None:
        """Send `pcm` in paced deltas; what is left once `stop` is set is dropped."""
        assert self.item is not None and self.item.ledger is not None
        ledger, fmt = self.item.ledger, self.plan.output_format
        ledger.generated += pcm.size
        step = fmt.sample_rate * DELTA_MS // 1000
        wire = fmt.encode(pcm)  # at once: per delta it would cost the loop several calls each
        for start in range(0, pcm.size, step):
            piece = pcm[start : start + step]
            if not await self._pacer.wait(piece.size / fmt.sample_rate, stop):
                return
            part = wire[start * fmt.bytes_per_sample : (start + step) * fmt.bytes_per_sample]
            delta = base64.b64encode(part).decode("ascii")
            event = {"type": "response.output_audio.delta", **self._message.where(), "delta": delta}
            on_sent = lambda n=piece.size: _count_sent(ledger, n)  # noqa: E731
            self._outbox.put(event, on_sent, pcm=piece, rate=fmt.sample_rate)
            if not self._sounded:
                self._sounded = True
                self._delivery.reached("first_audio", time.monotonic() - self._began)

    def _on_finished(self, out: Finished) -> None:
        if out.finish_reason == "stop":
            self.status = "completed"
        elif out.finish_reason == "length":
            self.status = "incomplete"
            self.status_details = {"type": "incomplete", "reason": "max_output_tokens"}
        elif out.finish_reason == "abort":
            self.status, self.status_details = (
                "cancelled",
                {"type": "cancelled", "reason": "client_cancelled"},
            )
        else:
            log.warning("session %s: response %s: engine error: %s", self.session_id, self.id, out.error)
            message = out.error or "generation failed"
            self._fail("server_error", "engine_error", message)
            # its audio still queued is never played: the failure is the next thing the client hears of
            self._outbox.drop(lambda e: e.get("response_id") != self.id or e["type"] != AUDIO_DELTA)
            self._outbox.put(error(message, "engine_error", type_="server_error"))

    def _fail(self, type_: str, code: str, message: str) -> None:
        self.status = "failed"
        self.status_details = {"type": "failed", "error": {"type": type_, "code": code, "message": message}}

    @property
    def item(self) -> Item | None:
        """The assistant message's item, once it opened."""
        return self._message.item

    def _finish(self) -> None:
        if self._sounded:
            self._delivery.delivered(self._pacer.dry_s)
        self._message.close(self.status == "completed")
        self._calls.close()
        self._emit("response.done")
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done(self)

    def _emit(self, kind: str) -> None:
        self._outbox.put({"type": kind, "response": self.wire()})

    def wire(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": self.status,
            "status_details": self.status_details,
            "output": [i.wire() for i in self.outputs],
            "conversation_id": "auto" if plan.in_conversation else None,
            "output_modalities": ["audio"] if plan.want_audio else ["text"],
            "max_output_tokens": plan.thinker.max_tokens,
            "audio": {"output": {"format": format_object(plan.output_format), "voice": plan.voice}},
            "usage": usage_object(self.usage),
            "metadata": plan.metadata,
        }


def _count_sent(ledger: AudioLedger, samples: int) -> None:
    ledger.sent += samples
