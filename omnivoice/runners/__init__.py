"""Runners execute one stage's model on a device: each stage's input embeddings, prefill and decode
steps with continuous batching, KV and prefix caches, sampling on the device, CUDA graphs and kernels.
`factory.build_runners` builds them from a profile."""
