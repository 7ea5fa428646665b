"""Authentication and abuse limits: API keys, client secrets, Twilio stream tokens, browser origins,
per-key rate limits (guard: the policy; middleware: where it runs)."""
