"""Keys never reach the logs: a logging filter that masks the API keys, any client secret or stream
token, and whatever follows `Bearer`, `Basic`, the key subprotocol or a `key=`/`token=` query
parameter (right or wrong keys alike), in a record's message and traceback, whatever logged it:
uvicorn logs WebSocket paths with their query strings, and at debug level the handshake's headers."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

MASK = "***"
_FORMATTER = logging.Formatter()
_TOKENS = re.compile(r"\b(ek|tw)_[A-Za-z0-9_-]{8,}")  # client secrets, Twilio stream tokens
_VALUE = r"[^\s,;\"'&]+"
_CREDENTIALS = [
    re.compile(rf"\b((?:[Bb]earer|BEARER|Basic|BASIC)\s+){_VALUE}"),  # Authorization headers
    re.compile(rf"(openai-insecure-api-key\.){_VALUE}"),  # the browsers' key subprotocol
    re.compile(rf"(?i)([?&](?:api[_-]?key|key|token|access_token)=){_VALUE}"),  # query strings
]


class RedactSecrets(logging.Filter):
    def __init__(self, keys: Iterable[str]) -> None:
        super().__init__()
        self._keys = sorted(set(keys), key=len, reverse=True)  # a key inside another: the longer first

    def redact(self, text: str) -> str:
        for key in self._keys:
            text = text.replace(key, MASK)
        for pattern in _CREDENTIALS:
            text = pattern.sub(rf"\g<1>{MASK}", text)
        return _TOKENS.sub(lambda m: f"{m.group(1)}_{MASK}", text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        # a traceback can quote a key too (an exception's message, a local in a frame's source line):
        # formatters print `exc_text` when it is set, so set it to the masked text
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


def redact_logs(keys: Iterable[str]) -> None:
    """Mask secrets in everything the root logger's handlers write (replacing an earlier mask)."""
    filt = RedactSecrets(keys)
    for handler in logging.getLogger().handlers:
        for old in [f for f in handler.filters if isinstance(f, RedactSecrets)]:
            handler.removeFilter(old)
        handler.addFilter(filt)
