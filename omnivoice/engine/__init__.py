"""The engine: the asyncio face of the staged pipeline and what runs under it.

`engine.Engine` takes requests and streams their text and audio (`api.EngineAPI` is what the server
may use of it); `loading` reads the served model's spec and tokenizer; `pipeline` starts the stage
workers (`stage`: threads, `stage_process`: processes, `ray_stages`: Ray actors) joined by
`connectors`; `routing` spreads requests over replicas; `supervisor` restarts the stages when a worker
dies; `warm_burst` warms them before serving.
"""
