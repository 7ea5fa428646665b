"""Where a thread's time goes (engine/step_clock.py): on a CPU while it computes, neither on a CPU nor
runnable while it sleeps (blocked, as a thread waiting for the GIL is); no GPU figure on a CPU."""

from __future__ import annotations

import threading
import time

from omnivoice.engine.step_clock import GpuUtilization, ThreadClock


def measure(work: str) -> tuple[float, float, float]:
    """(wall, on a CPU, runnable) seconds of 0.3 s of `work` (spin or sleep) in a thread of its own."""
    out: list[tuple[float, float, float]] = []

    def run() -> None:
        clock = ThreadClock()
        cpu0, runnable0 = clock.read()
        t0 = time.perf_counter()
        if work == "spin":
            while time.perf_counter() - t0 < 0.3:
                pass
        else:
            time.sleep(0.3)
        cpu1, runnable1 = clock.read()
        clock.close()
        out.append((time.perf_counter() - t0, cpu1 - cpu0, runnable1 - runnable0))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def test_a_spinning_thread_is_on_a_cpu_or_waiting_for_one() -> None:
    wall, cpu, runnable = measure("spin")
    assert cpu > 0.0
    assert cpu + runnable <= wall * 1.05 + 0.01
    assert cpu + runnable >= wall * 0.5  # a busy machine may also deschedule it for a while


def test_a_sleeping_thread_is_blocked() -> None:
    wall, cpu, runnable = measure("sleep")
    assert wall >= 0.3
    assert cpu + runnable < 0.5 * wall  # the rest of its wall time it was blocked


def test_no_gpu_figure_on_a_cpu() -> None:
    assert GpuUtilization("cpu").read() is None
    assert GpuUtilization(None).read() is None
