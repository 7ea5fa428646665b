"""Incremental detokenization: text deltas as tokens arrive, never splitting a UTF-8 character."""

from __future__ import annotations

from typing import Any

# Tokens decoded again with each new token, so multi-token characters and merges come out right.
_WINDOW = 6


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # tokens whose text has been emitted

    @property
    def count(self) -> int:
        return len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        if self._tok is None:  # a model without a tokenizer (dummy): ids are counted, no text
            return ""
        return self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_ids: tuple[int, ...] | list[int]) -> str:
        """Append tokens; return the newly completed text (may be empty)."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if full_text.endswith("\ufffd") or len(full_text) <= len(prefix_text):
            return ""  # an unfinished multi-byte character: wait for the next token
        delta = full_text[len(prefix_text) :]
        self._read = len(self._ids)
        self._prefix = max(0, self._read - _WINDOW)
        return delta

    def flush(self) -> str:
        """Text still held back at the end of the stream (a dangling partial character included)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._read = len(self._ids)
        self._prefix = self._read
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
