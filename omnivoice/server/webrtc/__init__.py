"""WebRTC transport for realtime sessions (aiortc): signalling (HTTP offer/answer), the app's calls,
the peer connection of each call, its data channel (events ride `oai-events`) and media tracks. Each
call drives an omnivoice.server.session session, opened like any other."""
