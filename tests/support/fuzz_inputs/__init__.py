"""Inputs for the fuzz tests (tests/fuzz): Hypothesis strategies and the valid messages they mutate.

`strategies` holds the generic ones (arbitrary JSON, mutations, raw garbage, lying base64); one
module per surface holds its valid messages and the strategies built on them: `wav` (WAV files),
`chat` (chat completion bodies), `realtime` (Realtime client events), `sdp` (WebRTC offers),
`twilio` (Twilio Media Streams frames). The unit fuzz tests and the live fuzz test share them.
"""
