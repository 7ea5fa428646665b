"""The engine core in a process of its own (`stages.core: process`): the core's side (process.py,
outbox.py) and the server's (client.py: EngineClient, an EngineAPI; handle.py: one core process)."""
