"""OpenAI Realtime over WebSocket: `GET /v1/realtime` (connection, one session per socket) and
`POST /v1/realtime/client_secrets` (client_secrets). The session it drives is omnivoice.server.session's."""
