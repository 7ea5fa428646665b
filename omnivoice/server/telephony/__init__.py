"""Telephony bridges: phone calls carried over a carrier's media WebSocket, each a realtime session."""
