"""Runners execute one stage's model on a device: prefill/decode steps, KV caches, sampling."""
