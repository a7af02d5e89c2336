"""The GPU's SM clock and board power while timed steps run, averaged per step (`training.bench`).

A step can be slower than its neighbours with the same kernels in the same order: an H100/H200
under its power limit lowers its SM clock whenever the board draws more than the limit (float8
matmuls draw the most), and raises it again when the draw falls. Every kernel of such a step is
slower by the same factor. Whether the host let the GPU wait (a stall of the code) or the GPU
ran its kernels at a lower clock shows in the clock beside each step's time: both go into the
bench's JSON.

`ClockSampler` reads NVML (nvidia-ml-py, a dependency of the package for the node check) on a
thread, every `interval_s`, from `start()` to `stop()`. `per_step` cuts the samples into the
steps: the timed steps run back to back on the GPU from the moment the first CUDA event was
recorded on an idle queue, so step k spans start + the sum of the first k step times.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sample:
    at_s: float
    """`time.perf_counter()` when read."""
    sm_clock_mhz: float
    power_w: float


@dataclass
class ClockSampler:
    """NVML's SM clock and power draw of GPU `index` on a thread (see the module docstring).
    `available` is False where NVML cannot be loaded (no driver, CPU runs): then nothing is
    sampled."""

    index: int
    interval_s: float = 0.005
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _nvml: object | None = None
    _handle: object | None = None

    def __post_init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._nvml = pynvml
        except Exception:  # no nvidia-ml-py, no driver (CPU), or no such GPU: not sampled
            self._nvml = None

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def _read(self) -> Sample:
        nvml = self._nvml
        return Sample(time.perf_counter(),
                      float(nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM)),
                      nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._read())
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        if self.available:
            self._thread = threading.Thread(target=self._loop, name="gpu-clocks", daemon=True)
            self._thread.start()

    def stop(self) -> list[Sample]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._nvml.nvmlShutdown()
        return self.samples


def per_step(samples: list[Sample], start_s: float,
             step_times_s: list[float]) -> list[dict[str, float | None]]:
    """Per step, the mean SM clock (MHz) and power (W) of the samples inside it (None where no
    sample fell inside: a step shorter than the sampling interval). Step k spans
    [start_s + sum(step_times_s[:k]), start_s + sum(step_times_s[:k + 1])); `samples` in time
    order."""
    times = [s.at_s for s in samples]
    out, begin = [], start_s
    for duration in step_times_s:
        end = begin + duration
        inside = samples[bisect.bisect_left(times, begin):bisect.bisect_left(times, end)]
        out.append({
            "sm_clock_mhz": (sum(s.sm_clock_mhz for s in inside) / len(inside)) if inside else None,
            "power_w": (sum(s.power_w for s in inside) / len(inside)) if inside else None,
        })
        begin = end
    return out
