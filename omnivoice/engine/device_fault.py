"""Device faults: a CUDA error in a stage's step poisons the device context of its whole process.

After an illegal instruction or memory access every later call on that context fails too, and the
first tensor freed by any thread can throw from a destructor, which aborts the process with no word
of why. So a stage that meets one stops stepping at once and reports it; its requests fail with the
device's message. A stage in its own process then ends and is restarted like any dead worker; a stage
in the server's process takes the server down with a clear log line and exit code `EXIT_DEVICE_FAULT`
shortly after (time for the failures to reach their clients), for its supervisor (systemd, Kubernetes,
Docker's restart policy) to start a fresh one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading

from omnivoice.runners.device_errors import is_out_of_memory

log = logging.getLogger(__name__)

EXIT_DEVICE_FAULT = 70  # EX_SOFTWARE: an internal error that a restart clears
EXIT_DELAY_S = 1.0  # failures of in-flight requests reach their clients meanwhile
OUT_OF_MEMORY = "out of GPU memory in this step"  # what a request failed by a step out of memory is told


class DeviceFault(RuntimeError):
    """A stage's device context is unusable; the stage must stop."""


def failure_text(error: BaseException) -> str:
    """What a request failed by `error` is told. A device out of memory names the GPU's processes and
    allocator figures, which are the operator's (the log has them), not the client's."""
    if is_out_of_memory(error):
        return f"{OUT_OF_MEMORY}; retry shortly (the server's log has the details)"
    return str(error)


def exit_soon(reason: str, delay_s: float = EXIT_DELAY_S) -> None:
    """End this process `delay_s` from now with EXIT_DEVICE_FAULT, without the interpreter's teardown
    (which would free tensors on the faulted device and abort)."""
    log.critical("%s; the server exits (code %d) for its supervisor to restart it", reason, EXIT_DEVICE_FAULT)

    def end() -> None:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed, or its reader is gone
                stream.flush()
        os._exit(EXIT_DEVICE_FAULT)

    timer = threading.Timer(delay_s, end)
    timer.daemon = True
    timer.start()
