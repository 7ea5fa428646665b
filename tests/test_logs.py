"""Log lines cannot be forged: the handler `configure_logging` installs escapes control characters in
every record's message and in a traceback's exception messages, whatever logged them (a real server:
tests/server/test_log_lines.py)."""

from __future__ import annotations

import io
import logging

import pytest

from omnivoice.logs import configure_logging, escape_controls

FORGED = "\r\n2030-01-01 00:00:00.000 INFO    MainProcess omnivoice.access: FORGED"


def lines(buf: io.StringIO) -> list[str]:
    return buf.getvalue().splitlines()


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("plain\ttab", "plain\ttab"),
        ("a\r\nb", "a\\r\\nb"),
        ("\x1b[31mred\x00", "\\x1b[31mred\\x00"),
        ("line\u2028sep\x85", "line\\u2028sep\\x85"),
        ("already \\n escaped", "already \\n escaped"),
    ],
)
def test_escape_controls(text: str, escaped: str) -> None:
    assert escape_controls(text) == escaped
    assert escape_controls(escaped) == escaped


def test_every_record_is_one_line_per_message() -> None:
    buf = io.StringIO()
    configure_logging("info", buf)
    log = logging.getLogger("omnivoice.test")
    log.info("client said %s", FORGED)
    log.warning(f"an f-string: {FORGED}")
    try:
        try:
            raise KeyError(FORGED)
        except KeyError as e:
            raise ValueError(f"bad input {FORGED}") from e
    except ValueError:
        log.exception("request failed")
    text = buf.getvalue()
    assert not [ln for ln in lines(buf) if ln.startswith("2030")]  # no line the client wrote
    assert text.count("\\r\\n2030-01-01") == 4
    assert "Traceback (most recent call last):" in text and "The above exception was the direct cause" in text
