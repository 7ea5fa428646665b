"""omnivoice: a real-time voice backend serving Qwen3-Omni thinker-talker models as a staged engine.

The packages, in the order of the data path (each imports only from those after it):
`cli` (the `omnivoice` command), `server` (transports -> sessions) and `bench` (load and parity tools),
`engine` (requests in, stages and their workers), `runners` (each stage's model on a device), `models`
(checkpoints, prompts, the tiny and dummy models), `audio` (codecs, resampling, VAD), then the shared
vocabulary: `config` (profiles), `logs`, `messages` (stage messages) and `types` (what a caller submits
to the engine and gets back).
"""
