"""`POST /v1/chat/completions`: the request's schema (schema), the engine's outputs as an OpenAI /
vLLM-Omni body or SSE chunks (format), the event stream that aborts the request when the client leaves
(sse), and the route that ties them to admission and the engine (endpoint)."""
