"""Where a stage thread's step time goes: on a CPU, waiting for one, or blocked.

A step's wall time splits three ways, read off the kernel's per-thread scheduler figures
(`/proc/thread-self/schedstat`: time on a CPU, time runnable but waiting for a CPU):

- on a CPU: the step's host work (Python, launching kernels, copies, and a CUDA sync, which spins);
- runnable, waiting for a CPU: the machine's cores were all busy (other processes, other threads);
- the rest, blocked: the thread slept. In a stage step it sleeps mostly to take the GIL back after a
  torch call released it (other threads of its process held it), and otherwise on a lock or a
  blocking device wait. So the blocked share of a step is an upper bound of, and in practice close
  to, its share of waiting for the GIL.

Reading the figures costs a `pread` of a small proc file (a couple of microseconds) at each end of a
step. Where the file is missing (not Linux) the CPU time is the thread's own clock and the runnable
wait counts as 0 (it then lands in "blocked").

`GpuUtilization` samples the device's utilisation (NVML through torch) at most once a second.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

SCHEDSTAT = "/proc/thread-self/schedstat"
GPU_SAMPLE_S = 1.0


@dataclass
class StepTime:
    """Totals over a worker's steps, in seconds."""

    cpu_s: float = 0.0  # on a CPU
    runnable_s: float = 0.0  # runnable, waiting for a CPU


class ThreadClock:
    """The calling thread's CPU time and runnable wait; make it in the thread it measures."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[float, float]:
        """(seconds on a CPU, seconds runnable waiting for one) since the thread started."""
        if self._fd is not None:
            try:
                run_ns, wait_ns, _ = os.pread(self._fd, 128, 0).split()
                return int(run_ns) / 1e9, int(wait_ns) / 1e9
            except (OSError, ValueError):
                self.close()
        return time.thread_time(), 0.0

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class GpuUtilization:
    """The utilisation (percent of the last sample period a kernel ran) of `device`, sampled at most
    every GPU_SAMPLE_S; None on a CPU, or where NVML cannot be read (no pynvml, no driver)."""

    def __init__(self, device: Any) -> None:
        text = str(device) if device is not None else ""
        self._device = text if text.startswith("cuda") else None
        self._value: float | None = None
        self._next = 0.0

    def read(self) -> float | None:
        if self._device is None:
            return None
        now = time.monotonic()
        if now >= self._next:
            self._next = now + GPU_SAMPLE_S
            try:
                import torch

                self._value = float(torch.cuda.utilization(self._device))
            except Exception:  # no NVML here: stop asking
                self._device, self._value = None, None
        return self._value
