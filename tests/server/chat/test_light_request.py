"""Which chat requests are prepared on the event loop (short text) and which in a worker thread."""

from __future__ import annotations

from typing import Any

import pytest

from omnivoice.server.chat.endpoint import INLINE_MESSAGES, INLINE_TEXT_CHARS, light_request


def _body(*contents: Any, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": c} for c in contents], **extra}


@pytest.mark.parametrize(
    "body",
    [
        _body("Hello there."),
        _body([{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]),
        _body("x" * INLINE_TEXT_CHARS),
        _body(*["hi"] * INLINE_MESSAGES),
        _body("Hi", response_format={"type": "text"}),
        {"messages": "not a list"},  # refused by its validation, at once
    ],
)
def test_short_text_is_light(body: dict[str, Any]) -> None:
    assert light_request(body)


@pytest.mark.parametrize(
    "body",
    [
        _body("x" * (INLINE_TEXT_CHARS + 1)),
        _body("x" * (INLINE_TEXT_CHARS // 2), "y" * (INLINE_TEXT_CHARS // 2 + 1)),
        _body(*["hi"] * (INLINE_MESSAGES + 1)),
        _body([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]),
        _body([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]),
        _body("Hi", tools=[{"type": "function", "function": {"name": "f"}}]),
        _body("Hi", response_format={"type": "json_object"}),
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]},
    ],
)
def test_audio_images_schemas_and_long_text_go_to_a_thread(body: dict[str, Any]) -> None:
    assert not light_request(body)
