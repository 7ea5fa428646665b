"""Logging setup shared by the CLI and the stage processes it starts.

Every record is one line: clients choose much of what is logged (paths, model names, ids, WebSocket
query strings, exception messages that quote their input), and a CR or LF among it would let anyone
write lines that look like the server's own. So the handler escapes control characters in each
record's message, after its arguments are merged in, and in the messages of a traceback, whatever
logged it: no call site has to remember to.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import re
import signal
import sys
import traceback
from types import TracebackType
from typing import IO

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(processName)s %(name)s: %(message)s"

# C0 and C1 controls but tab, Unicode line/paragraph separators, bidirectional overrides and isolates
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}
# the lines of a traceback that Python writes itself (frames, chain notes); the rest are messages
_TRACEBACK_LINES = (
    "Traceback (most recent call last):",
    "  File ",
    "  [Previous line repeated",
    "\nThe above exception was the direct cause",
    "\nDuring handling of the above exception",
)

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def escape_controls(text: str) -> str:
    """`text` with its control characters (CR, LF, ESC...; not tab) written as escapes (`\\r`, `\\n`,
    `\\x1b`, `\\u2028`). Backslashes are left alone, so escaping twice changes nothing."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(lambda m: _NAMED.get(m[0]) or _code(ord(m[0])), text)


def _code(point: int) -> str:
    return f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}"


def format_exception(exc_info: ExcInfo) -> str:
    """A traceback as Python prints it, but each exception's message escaped onto one line."""
    chunks = traceback.TracebackException(*exc_info).format()
    lines = [c if c.startswith(_TRACEBACK_LINES) else escape_controls(c.rstrip("\n")) + "\n" for c in chunks]
    return "".join(lines).rstrip("\n")


class EscapeControls(logging.Filter):
    """Makes every record one line of text per message (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: the handler reports it when it formats the record
            return True
        clean = escape_controls(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            record.exc_text = format_exception(record.exc_info)  # type: ignore[arg-type]
        return True


def configure_logging(level: str, stream: IO[str] | None = None) -> None:
    """Configure the root logger once, for the whole process (uvicorn's loggers propagate to it): one
    handler, on stderr unless `stream`, that escapes control characters (EscapeControls)."""
    handler = logging.StreamHandler(stream)
    handler.addFilter(EscapeControls())
    logging.basicConfig(
        level=level.upper(), format=LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S", handlers=[handler], force=True
    )


def stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's Python stack to stderr (a stuck server, benchmark or
    stage process shows where each thread waits) and the process goes on."""
    err = sys.__stderr__  # the process's own stderr (sys.stderr may be replaced, as under pytest)
    if hasattr(signal, "SIGUSR1") and err is not None:
        with contextlib.suppress(OSError, ValueError):  # no file descriptor: no dumps
            faulthandler.register(signal.SIGUSR1, file=err, all_threads=True)
