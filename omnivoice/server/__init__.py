"""The Starlette app over the engine (`create_app`): every HTTP and WebSocket route the server serves.

The transports, side by side: chat (`/v1/chat/completions`), realtime (OpenAI Realtime over
WebSocket), webrtc and telephony (Twilio Media Streams). Below them, session: the realtime session
the last three drive with the same events, and the one way to open one. Shared by all: auth (API
keys, client secrets, origins, rate limits), admission, limits and drain (lifecycle, drain),
`/health`, `/v1/models`, `/metrics` and `/v1/debug/state`, and the voice-chat page (page).
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    """`create_app`, imported when first asked for: `omnivoice serve` checks its keys (server.auth)
    and starts the engine core before it imports the server stack (torch among it)."""
    if name == "create_app":
        from omnivoice.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
