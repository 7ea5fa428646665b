"""WebRTC transport for realtime sessions (aiortc): signalling (HTTP offer/answer), the peer
connection of each call, and its media tracks. Events ride the `oai-events` data channel."""
