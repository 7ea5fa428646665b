"""The model side: a Qwen3-Omni checkpoint's loading and `ModelSpec` (`loader`), chat messages to a
thinker `Prompt` (`prompt`, `token_prompt`), the tiny random-weight checkpoint served by default
(`tiny`) and the full-size `dummy:` models with their tokenizer (`dummy`, `dummy_tokenizer`)."""
