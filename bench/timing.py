"""The timers of the benchmarks: median host wall time (`median_ms`) or GPU time
(`device_median_ms`) of a call, after a warm-up. CuPy is imported only by the GPU timer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(work: Callable[[], object], repeats: int) -> float:
    """Median of `repeats` timed calls of `work`, in ms, after one untimed call (caches,
    first-touch allocations)."""
    work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def device_median_ms(work: Callable[[], object], repeats: int) -> float:
    """Median GPU time of `repeats` calls of `work`, in ms, after one untimed call (NVRTC,
    caches): CUDA events recorded on the current stream around each call."""
    import cupy

    work()
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        work()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)
