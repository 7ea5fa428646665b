"""The realtime session, whatever carries it: the transport-neutral core that the WebSocket, WebRTC
and Twilio transports drive with the same client events.

`Session` (session) handles the client's events; the input buffer and server-VAD turn-taking
(turns, input_audio), the conversation (conversation, items, ledger), what a response should
produce (planning), its prompt (prompting) and the response itself (responding, response, pacing,
read_ahead) hang off it. Server events leave through the `Outbox` (outbox), the one writer of a
connection, which each transport may subclass. The protocol's vocabulary: client events (protocol), server
events (server_events) and session settings (session_config). `Sessions` (registry) is the app's
set of open sessions and the one way to open one (admission and release); `ending` is how a
connection ends besides the client leaving (a client that stops reading, the server's drain).
"""
