"""Renders run off the event loop on a fixed set of worker threads, behind a bounded
queue: when `workers` renders run and `max_queue` more wait, a new one is refused at once
(503 with Retry-After) instead of waiting without bound."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.errors import ApiError
from app.metrics import Metrics

T = TypeVar("T")


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A job's result with its queue wait and run time, in milliseconds."""

    value: T
    queue_ms: float
    run_ms: float


class RenderQueue:
    def __init__(self, workers: int, max_queue: int, metrics: Metrics, backend: str):
        self.workers, self.max_queue = workers, max_queue
        self.metrics, self.backend = metrics, backend
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="render")
        self._lock = threading.Lock()  # guards the two counters, changed from workers too
        self._waiting = 0
        self._running = 0
        self._mean_run_s = 0.5  # running estimate for Retry-After

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> int:
        return self._running

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained by one place."""
        return max(1, math.ceil(self._mean_run_s * (self._waiting + 1) / self.workers))

    async def run(self, job: Callable[[], T]) -> Timed[T]:
        """Run `job` on a worker thread; raises ApiError 503 when the queue is full.
        Exceptions of `job` propagate to the caller."""
        with self._lock:
            admitted = self._waiting + self._running < self.workers + self.max_queue
            if admitted:
                self._waiting += 1
                self.metrics.queue_depth.set(self._waiting)
        if not admitted:
            retry = self.retry_after_s()
            raise ApiError(503, "overloaded", f"the server is busy ({self._waiting} renders waiting); retry in {retry} s", {"Retry-After": str(retry)})

        submitted = time.perf_counter()
        started = [0.0]

        def timed_job() -> T:
            started[0] = time.perf_counter()
            with self._lock:
                self._waiting -= 1
                self._running += 1
                self.metrics.queue_depth.set(self._waiting)
                self.metrics.renders_running.set(self._running)
            try:
                return job()
            finally:
                with self._lock:
                    self._running -= 1
                    self.metrics.renders_running.set(self._running)

        try:
            future = self._executor.submit(timed_job)
        except RuntimeError:  # the executor was shut down: the server is stopping
            with self._lock:
                self._waiting -= 1
            raise ApiError(503, "shutting_down", "the server is shutting down", {"Retry-After": "5"}) from None
        future.add_done_callback(self._release_if_never_started)
        value = await asyncio.wrap_future(future)
        run_s = time.perf_counter() - started[0]
        queue_s = started[0] - submitted
        self._mean_run_s = 0.8 * self._mean_run_s + 0.2 * run_s
        self.metrics.queue_wait.observe(queue_s)
        self.metrics.render_time.labels(self.backend).observe(run_s)
        return Timed(value, queue_s * 1000, run_s * 1000)

    def _release_if_never_started(self, future) -> None:
        """A job cancelled while waiting (its caller went away) never ran `timed_job`:
        give its place in the queue back."""
        if future.cancelled():
            with self._lock:
                self._waiting -= 1
                self.metrics.queue_depth.set(self._waiting)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
