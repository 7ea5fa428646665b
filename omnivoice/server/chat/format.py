"""Wire shapes of `/v1/chat/completions` responses, compatible with both the `openai` SDK and vLLM-Omni.

Non-streaming (`object: "chat.completion"`), with text and audio requested:

    choices[0] = {index: 0, message: {role: "assistant", content: TEXT,
                                      audio: {id, data: B64, expires_at, transcript: TEXT}}, finish_reason}
    choices[1] = {index: 1, message: {role: "assistant", content: null, audio: <same object>}, finish_reason}

  The `openai` SDK reads `choices[0].message.content` and `choices[0].message.audio.data`; vLLM-Omni's
  clients and tests read the text from choice 0 and the audio from choice 1 (`len(choices) == 2`).
  (vLLM-Omni's example client saves audio from every choice that has it, so it writes the file twice.)
  Audio only: just choice 0, `content: null`, the text in `audio.transcript`. Text only: one choice,
  no `audio`. B64 is a complete 16-bit mono WAV at the engine's rate (24 kHz) for `audio.format: wav`
  (the default), raw pcm16 for `pcm16`. `expires_at` is informational: audio is not stored, so the
  `id` cannot be referenced in a later request.

Streaming (SSE, `object: "chat.completion.chunk"`), every chunk sent as soon as the engine yields it,
each with a top-level `modality` ("text" | "audio") as vLLM-Omni's benchmark expects:

    text:  {modality: "text",  choices: [{index: 0, delta: {content: TEXT}, finish_reason: null}]}
    audio: {modality: "audio", choices: [{index: 0, delta: {content: B64,
                                                            audio: {id, data: B64, transcript?}}, ...}]}
    end:   {modality: "text",  choices: [{index: 0, delta: {audio: {id, transcript}}?,
                                          finish_reason: "stop" | "length"}]}
    usage: {modality: "text",  choices: [], usage: {...}}        (only with stream_options.include_usage)
    data: [DONE]

  The first chunk's delta also carries `role: "assistant"`. Audio is in both `delta.content`
  (vLLM-Omni) and `delta.audio.data` (OpenAI); B64 is one self-contained WAV per chunk for `wav`
  (what vLLM-Omni's benchmark decodes), raw pcm16 24 kHz for `pcm16` (OpenAI's streaming format).
  Clients must use `modality` to tell base64 audio from text in `delta.content`. With audio, the
  spoken text also rides on the audio chunks as `delta.audio.transcript`, as OpenAI streams it: each
  audio chunk carries the text written since the one before, and the end chunk what is left, so the
  transcripts joined are the whole text. Audio only: no text chunks, the transcripts are the text.
  A failure mid-stream is sent as `data: {"error": {...}}` (the `openai` SDK raises it as an
  APIError), then `[DONE]`.

Function calls: the message's `tool_calls` (`[{id, type: "function", function: {name, arguments}}]`)
with `finish_reason: "tool_calls"`; streamed, OpenAI's deltas: a call's first chunk
`{tool_calls: [{index, id, type: "function", function: {name, arguments: ""}}]}`, then
`{tool_calls: [{index, function: {arguments: PIECE}}]}` as its arguments arrive (`modality: "text"`).
The talker never speaks a call: a response that is only calls has no audio (`message.audio` null,
no second choice).

Usage: `completion_tokens` counts text tokens only (so tok/s compares with vLLM-Omni's benchmark);
codec frames are reported in `completion_tokens_details.audio_tokens`.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from omnivoice.audio import encode_wav, pcm16_bytes
from omnivoice.types import ToolCall, ToolCallDelta, Usage

AUDIO_TTL_S = 24 * 3600


@dataclass(frozen=True)
class Turn:
    """What one response needs to know to format its output."""

    id: str  # chatcmpl-..., also the engine's request id
    created: int
    model: str
    want_text: bool
    want_audio: bool
    audio_format: Literal["wav", "pcm16"]
    include_usage: bool

    @property
    def audio_id(self) -> str:
        return "audio-" + self.id.removeprefix("chatcmpl-")


def encode_audio(pcm: np.ndarray, sample_rate: int, audio_format: str) -> str:
    """Base64 of `pcm` as a whole WAV file (`wav`) or raw little-endian 16-bit samples (`pcm16`)."""
    return audio_b64(pcm, sample_rate, audio_format).decode("ascii")


def audio_b64(pcm: np.ndarray, sample_rate: int, audio_format: str) -> bytes:
    """`encode_audio` as ASCII bytes, for `ChunkWriter.audio_event`."""
    data = encode_wav(pcm, sample_rate) if audio_format == "wav" else pcm16_bytes(pcm)
    return base64.b64encode(data)


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"audio_tokens": usage.audio_frames},
    }


def completion_body(
    turn: Turn,
    text: str,
    audio_b64: str | None,
    finish_reason: str,
    usage: Usage,
    tool_calls: tuple[ToolCall, ...] = (),
) -> dict:
    """The non-streaming response (see the module docstring); `audio_b64` None: no audio was made."""
    message: dict[str, Any] = {"role": "assistant", "content": text if turn.want_text else None}
    if tool_calls:
        message["content"] = message["content"] or None
        message["tool_calls"] = [tool_call_body(c) for c in tool_calls]
    choices = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}]
    if turn.want_audio and audio_b64 is None:
        message["audio"] = None
    elif turn.want_audio:
        audio = {
            "id": turn.audio_id,
            "data": audio_b64,
            "expires_at": turn.created + AUDIO_TTL_S,
            "transcript": text,
        }
        message["audio"] = audio
        if turn.want_text:
            audio_message = {"role": "assistant", "content": None, "audio": audio}
            choices.append(
                {"index": 1, "message": audio_message, "logprobs": None, "finish_reason": finish_reason}
            )
    return {
        "id": turn.id,
        "object": "chat.completion",
        "created": turn.created,
        "model": turn.model,
        "choices": choices,
        "usage": usage_body(usage),
    }


def tool_call_body(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


class ChunkWriter:
    """Builds the SSE chunks of one streamed response, in order (see the module docstring)."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self._role_sent = False

    def _chunk(self, modality: str, delta: dict[str, Any], finish_reason: str | None = None) -> dict:
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        t = self.turn
        return {
            "id": t.id,
            "object": "chat.completion.chunk",
            "created": t.created,
            "model": t.model,
            "modality": modality,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def text(self, text: str) -> dict:
        return self._chunk("text", {"content": text})

    def audio_event(self, b64: bytes, transcript: str | None = None) -> bytes:
        """An audio chunk as its whole SSE event (what `sse_event` makes of the chunk's JSON), built
        around the base64 rather than through a JSON encoder: base64 needs no escaping, and an
        encoder would scan both copies of it, on the event loop, for every chunk."""
        t = self.turn
        role = b"" if self._role_sent else b'"role":"assistant",'
        self._role_sent = True
        said = b',"transcript":' + _json(transcript) if transcript else b""
        return b"".join(
            (
                b'data: {"id":', _json(t.id), b',"object":"chat.completion.chunk","created":',
                str(t.created).encode(), b',"model":', _json(t.model),
                b',"modality":"audio","choices":[{"index":0,"delta":{', role, b'"content":"', b64,
                b'","audio":{"id":', _json(t.audio_id), b',"data":"', b64, b'"', said,
                b'}},"logprobs":null,"finish_reason":null}]}\n\n',
            )
        )  # fmt: skip

    def tool_call(self, delta: ToolCallDelta) -> dict:
        """A call's first chunk (id, name) or a piece of its arguments."""
        if delta.name is not None:
            function = {"name": delta.name, "arguments": delta.arguments}
            call = {"index": delta.index, "id": delta.call_id, "type": "function", "function": function}
        else:
            call = {"index": delta.index, "function": {"arguments": delta.arguments}}
        return self._chunk("text", {"tool_calls": [call]})

    def end(self, finish_reason: str, transcript: str | None = None) -> dict:
        delta = {"audio": {"id": self.turn.audio_id, "transcript": transcript}} if transcript else {}
        return self._chunk("text", delta, finish_reason)

    def usage(self, usage: Usage) -> dict:
        t = self.turn
        return {
            "id": t.id,
            "object": "chat.completion.chunk",
            "created": t.created,
            "model": t.model,
            "modality": "text",
            "choices": [],
            "usage": usage_body(usage),
        }
