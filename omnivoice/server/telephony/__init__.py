"""Telephony bridges: phone calls carried over a carrier's media WebSocket, each driving a realtime
session (omnivoice.server.session). Twilio Media Streams: the endpoint, the call, its protocol and
outbox, playout marks, the TwiML webhook, and who a stream is charged to (stream_auth)."""
