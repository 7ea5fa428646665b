"""The engine's outputs of one chat request as the client gets them: one JSON body (`complete`) or
SSE chunks as they come (`stream`), in the shapes of `chat.format`; function calls, audio and the
finish reason included. Leaving early (the client goes away, the server shuts down) aborts the
engine request; each request's outcome is recorded once in its `RequestTimer`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnivoice.engine.api import EngineAPI
from omnivoice.server.chat.format import ChunkWriter, Turn, audio_b64, completion_body, encode_audio
from omnivoice.server.chat.sse import DONE, run_unless_disconnected, sse_event
from omnivoice.server.errors import (
    APIError,
    internal_error,
    server_overloaded,
    service_unavailable,
    shutting_down,
)
from omnivoice.server.metrics import RequestTimer
from omnivoice.types import (
    AudioChunk,
    EngineOverloaded,
    EngineUnavailable,
    Finished,
    GenerationRequest,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)

log = logging.getLogger(__name__)


async def complete(
    request: Request, engine: EngineAPI, gen: GenerationRequest, turn: Turn, timer: RequestTimer
) -> Response:
    """Non-streaming: collect everything; a client that disconnects meanwhile aborts the request."""
    rid = request.state.request_id
    stop = request.app.state.drain.expired
    try:
        result = await run_unless_disconnected(request.receive, _collect(engine, gen, timer), stop)
    except EngineOverloaded as e:  # filled up between the check and the start: rare
        timer.finish("rejected")
        raise server_overloaded(str(e)) from None
    except EngineUnavailable as e:  # the stages stopped between the check and the start
        timer.finish("unavailable")
        raise service_unavailable(str(e)) from None
    if result is None:
        timer.finish("cancelled")
        if stop.is_set():
            log.info("request %s: the server is shutting down; aborted %s", rid, gen.request_id)
            raise shutting_down()
        log.info("request %s: client disconnected; aborted %s", rid, gen.request_id)
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    text, pcm, rate, calls, fin = result
    usage = fin.usage
    if fin.finish_reason not in ("stop", "length"):
        timer.finish("error", usage.prompt_tokens, usage.completion_tokens)
        log.warning("request %s: %s ended with %s: %s", rid, gen.request_id, fin.finish_reason, fin.error)
        raise _failed(engine, fin)
    timer.finish("ok", usage.prompt_tokens, usage.completion_tokens)
    _log_done(rid, gen.request_id, "ok", timer)
    # a response that is only calls has no audio: the talker never speaks a call
    spoken = turn.want_audio and (pcm.size > 0 or not calls)
    audio_b64 = encode_audio(pcm, rate, turn.audio_format) if spoken else None
    reason = _finish_reason(fin, bool(calls))
    return JSONResponse(completion_body(turn, text, audio_b64, reason, usage, tuple(calls)))


def _finish_reason(fin: Finished, called: bool) -> str:
    """OpenAI's reason: a response that ends after calling functions ends with "tool_calls"."""
    return "tool_calls" if called and fin.finish_reason == "stop" else fin.finish_reason


def _log_call(rid: str, done: ToolCallDone) -> None:
    if done.error is not None:
        log.warning("request %s: tool call %s (%s): %s", rid, done.call.id, done.call.name, done.error)


async def _collect(
    engine: EngineAPI, gen: GenerationRequest, timer: RequestTimer
) -> tuple[str, np.ndarray, int, list[ToolCall], Finished]:
    texts: list[str] = []
    pcm: list[np.ndarray] = []
    calls: list[ToolCall] = []
    rate = engine.info.sample_rate
    async with aclosing(engine.generate(gen)) as outputs:  # closing early aborts in every stage
        async for out in outputs:
            if isinstance(out, TextDelta):
                texts.append(out.text)
                timer.text()
            elif isinstance(out, ToolCallDone):
                _log_call(gen.request_id, out)
                calls.append(out.call)
            elif isinstance(out, AudioChunk):
                pcm.append(out.pcm)
                rate = out.sample_rate
                timer.audio(out.pcm.size / out.sample_rate)
            elif isinstance(out, Finished):
                audio = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
                return "".join(texts), audio, rate, calls, out
    raise RuntimeError("the engine's output ended without Finished")


async def stream(
    engine: EngineAPI, gen: GenerationRequest, turn: Turn, timer: RequestTimer, rid: str
) -> AsyncGenerator[bytes, None]:
    """SSE events of one request; closing this generator early aborts the engine request."""
    writer = ChunkWriter(turn)
    status, usage = "cancelled", Usage()
    transcript: list[str] = []  # text spoken, waiting to ride on the next audio chunk
    called = False
    outputs = engine.generate(gen)
    try:
        async for out in outputs:
            if isinstance(out, TextDelta) and out.text:
                if turn.want_text:
                    yield sse_event(writer.text(out.text))
                    timer.text()
                if turn.want_audio:
                    transcript.append(out.text)
            elif isinstance(out, ToolCallDelta):
                yield sse_event(writer.tool_call(out))
            elif isinstance(out, ToolCallDone):
                _log_call(gen.request_id, out)
                called = True
            elif isinstance(out, AudioChunk) and turn.want_audio:
                b64 = audio_b64(out.pcm, out.sample_rate, turn.audio_format)
                yield writer.audio_event(b64, "".join(transcript))
                transcript.clear()
                timer.audio(out.pcm.size / out.sample_rate)
            elif isinstance(out, Finished):
                usage = out.usage
                if out.finish_reason in ("stop", "length"):
                    status = "ok"
                    yield sse_event(writer.end(_finish_reason(out, called), "".join(transcript)))
                    if turn.include_usage:
                        yield sse_event(writer.usage(usage))
                else:
                    status = "error"
                    log.warning(
                        "request %s: %s ended with %s: %s", rid, gen.request_id, out.finish_reason, out.error
                    )
                    yield sse_event(_failed(engine, out).body())
                yield DONE
                break
    except EngineOverloaded as e:  # filled up between the check and the start: rare
        status = "rejected"
        yield sse_event(server_overloaded(str(e)).body())
        yield DONE
    except EngineUnavailable as e:  # the stages stopped between the check and the start
        status = "unavailable"
        yield sse_event(service_unavailable(str(e)).body())
        yield DONE
    except Exception:
        status = "error"
        log.exception("request %s: streaming %s failed", rid, gen.request_id)
        yield sse_event(internal_error().body())
        yield DONE
    finally:
        await outputs.aclose()
        timer.finish(status, usage.prompt_tokens, usage.completion_tokens)
        _log_done(rid, gen.request_id, status, timer)


def _failed(engine: EngineAPI, fin: Finished) -> APIError:
    """A request that ended with an error: 503 when the engine's stages stopped under it (they are
    restarting, or could not be: retry), else a 500."""
    message = fin.error or f"generation ended with {fin.finish_reason}"
    return service_unavailable(message) if engine.failure else internal_error(message)


def _log_done(rid: str, engine_id: str, status: str, timer: RequestTimer) -> None:
    log.info(
        "request %s: %s %s ttft=%s first_audio=%s audio=%.2fs",
        rid, engine_id, status, _ms(timer.first_text), _ms(timer.first_audio), timer.audio_s,
    )  # fmt: skip


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"
