"""The Starlette app over the engine (`create_app`): every HTTP and WebSocket route the server serves.

`/v1/chat/completions` (chat), the realtime session and its transports
(realtime: OpenAI Realtime over WebSocket; webrtc; telephony: Twilio Media Streams), auth (API keys,
client secrets, origins, rate limits), admission, limits and drain (lifecycle, drain), `/health`,
`/v1/models`, `/metrics` and `/v1/debug/state`, and the voice-chat page (page).
"""

from omnivoice.server.app import create_app

__all__ = ["create_app"]
