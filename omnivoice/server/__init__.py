"""HTTP transport: the OpenAI-compatible chat-completions API over the engine (`create_app`)."""

from omnivoice.server.app import create_app

__all__ = ["create_app"]
