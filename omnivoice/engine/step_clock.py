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

`GpuUtilization` samples the device's utilisation (NVML through torch) at most once a second, and
adds each sample times the time since the one before into the device's busy seconds: a counter whose
difference over a run, divided by its length, is the run's mean utilisation (the gauge alone says only
what the last second was, idle by the time a run's last scrape reads it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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
    every GPU_SAMPLE_S, and its integral over time; None on a CPU, or where NVML cannot be read (no
    pynvml, no driver). `sample` reads the percentage (default: `torch.cuda.utilization`)."""

    def __init__(
        self,
        device: Any,
        sample: Callable[[str], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        text = str(device) if device is not None else ""
        self._device = text if text.startswith("cuda") else None
        self._sample = sample or _torch_utilization
        self._clock = clock
        self._value: float | None = None
        self._sampled_at: float | None = None
        self._busy_s = 0.0

    def read(self) -> float | None:
        """The latest sample, taking a new one if GPU_SAMPLE_S has passed."""
        if self._device is None:
            return None
        now = self._clock()
        if self._sampled_at is None or now - self._sampled_at >= GPU_SAMPLE_S:
            try:
                value = float(self._sample(self._device))
            except Exception:  # no NVML here: stop asking
                self._device, self._value = None, None
                return None
            if self._sampled_at is not None:  # the sample stands for the time since the last one
                self._busy_s += value / 100.0 * (now - self._sampled_at)
            self._value, self._sampled_at = value, now
        return self._value

    @property
    def busy_s(self) -> float | None:
        """Seconds the device ran a kernel since the first sample, as its samples tell; None where
        there is no figure."""
        return None if self._device is None else self._busy_s


def _torch_utilization(device: str) -> float:
    import torch

    return float(torch.cuda.utilization(device))
