"""OpenAI Realtime API (GA and beta events) over WebSocket: `GET /v1/realtime`."""
