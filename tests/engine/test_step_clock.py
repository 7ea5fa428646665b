"""Where a thread's time goes (engine/step_clock.py): on a CPU while it computes, neither on a CPU nor
runnable while it sleeps (blocked, as a thread waiting for the GIL is); no GPU figure on a CPU, and a
GPU's busy seconds integrate its utilisation samples over time."""

from __future__ import annotations

import threading
import time

import pytest

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


def test_gpu_busy_seconds_integrate_the_samples_over_time() -> None:
    now = [0.0]
    percents = iter([50.0, 100.0, 0.0, 25.0])
    gpu = GpuUtilization("cuda:0", sample=lambda device: next(percents), clock=lambda: now[0])
    assert gpu.read() == 50.0 and gpu.busy_s == 0.0  # the first sample starts the clock
    now[0] = 0.5
    assert gpu.read() == 50.0 and gpu.busy_s == 0.0, "sampled at most once a second"
    now[0] = 2.0
    assert gpu.read() == 100.0 and gpu.busy_s == pytest.approx(2.0)
    now[0] = 4.0
    assert gpu.read() == 0.0 and gpu.busy_s == pytest.approx(2.0)
    now[0] = 8.0
    assert gpu.read() == 25.0 and gpu.busy_s == pytest.approx(3.0)


def test_gpu_figures_stop_where_nvml_cannot_be_read() -> None:
    def no_nvml(device: str) -> float:
        raise RuntimeError("pynvml is not installed")

    gpu = GpuUtilization("cuda:0", sample=no_nvml)
    assert gpu.read() is None and gpu.busy_s is None
