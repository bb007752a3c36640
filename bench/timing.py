"""The one host-side timer of the benchmarks: median wall time of a call, after a warm-up."""

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
