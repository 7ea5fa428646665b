"""Authentication and abuse limits: API keys, client secrets (the store; minting them is the realtime
transport's route), Twilio stream tokens, browser origins, per-key rate limits (guard: the policy;
middleware: where it runs)."""
