"""Renders run off the event loop on a fixed set of worker threads, behind a bounded
queue, within a memory budget.

- Admission: a request takes a place before its body is read; when `workers` renders run
  and `max_queue` more wait, it is refused at once (503 with Retry-After), so an overload
  costs neither an upload nor memory.
- Abandonment: while a render waits for a worker, the client's connection is watched; if
  the client goes away, its render is dropped and its place given back.
- Memory: renders take `pixels` from a shared budget (`PENCIL_MAX_CONCURRENT_PIXELS`)
  before they allocate their working planes, so two 50 MP photos render one after the
  other instead of together.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.errors import ApiError
from app.metrics import Metrics

T = TypeVar("T")
WATCH_INTERVAL_S = 0.25  # how often a waiting render checks that its client is still there


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A job's result with its queue wait and run time, in milliseconds."""

    value: T
    queue_ms: float
    run_ms: float


class PixelBudget:
    """A counting budget of pixels shared by the worker threads. `reserve(n)` blocks until
    n pixels are free (a job larger than the whole budget takes all of it, alone)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._free = capacity
        self._changed = threading.Condition()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    @contextmanager
    def reserve(self, pixels: int) -> Iterator[None]:
        weight = min(pixels, self.capacity)
        with self._changed:
            self._changed.wait_for(lambda: self._free >= weight)
            self._free -= weight
        try:
            yield
        finally:
            with self._changed:
                self._free += weight
                self._changed.notify_all()


class Place:
    """A request's place in the queue, from admission until its job has run."""

    def __init__(self, queue: RenderQueue):
        self._queue = queue
        self.submitted = False

    async def run(self, job: Callable[[], T], client_gone: Callable[[], Awaitable[bool]] | None = None) -> Timed[T]:
        """Run `job` on a worker thread. Its exceptions propagate. `client_gone` is polled
        while the job waits; when it answers True the job is dropped (ApiError 499)."""
        self.submitted = True
        return await self._queue._run(job, client_gone)


class RenderQueue:
    def __init__(self, workers: int, max_queue: int, max_concurrent_pixels: int, metrics: Metrics, backend: str):
        self.workers, self.max_queue = workers, max_queue
        self.metrics, self.backend = metrics, backend
        self.pixels = PixelBudget(max_concurrent_pixels)
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

    @asynccontextmanager
    async def admission(self) -> AsyncIterator[Place]:
        """Hold a place (raises ApiError 503 when the queue is full) for the time the
        request is read and its job runs: `async with queue.admission() as place: ...
        await place.run(job)`. Leaving without running gives the place back."""
        with self._lock:
            admitted = self._waiting + self._running < self.workers + self.max_queue
            if admitted:
                self._add_waiting(+1)
        if not admitted:
            retry = self.retry_after_s()
            raise ApiError(503, "overloaded", f"the server is busy ({self._waiting} renders waiting); retry in {retry} s", {"Retry-After": str(retry)})
        place = Place(self)
        try:
            yield place
        finally:
            if not place.submitted:
                with self._lock:
                    self._add_waiting(-1)

    async def _run(self, job: Callable[[], T], client_gone: Callable[[], Awaitable[bool]] | None) -> Timed[T]:
        submitted = time.perf_counter()
        started = [0.0]

        def timed_job() -> T:
            started[0] = time.perf_counter()
            with self._lock:
                self._add_waiting(-1)
                self._running += 1
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
                self._add_waiting(-1)
            raise ApiError(503, "shutting_down", "the server is shutting down", {"Retry-After": "5"}) from None
        future.add_done_callback(self._release_if_never_started)
        result = asyncio.wrap_future(future)
        if client_gone is not None:
            await self._watch_while_waiting(future, result, client_gone)
        value = await result
        run_s = time.perf_counter() - started[0]
        queue_s = started[0] - submitted
        self._mean_run_s = 0.8 * self._mean_run_s + 0.2 * run_s
        self.metrics.queue_wait.observe(queue_s)
        self.metrics.render_time.labels(self.backend).observe(run_s)
        return Timed(value, queue_s * 1000, run_s * 1000)

    async def _watch_while_waiting(self, future: Future, result: asyncio.Future, client_gone: Callable[[], Awaitable[bool]]) -> None:
        """Until a worker takes the job, drop it if the client has gone."""
        while not future.running() and not future.done():
            done, _ = await asyncio.wait({result}, timeout=WATCH_INTERVAL_S)
            if done:
                return
            if await client_gone() and future.cancel():
                raise ApiError(499, "client_closed_request", "the client closed the connection before its render started")

    def _add_waiting(self, delta: int) -> None:
        self._waiting += delta
        self.metrics.queue_depth.set(self._waiting)

    def _release_if_never_started(self, future: Future) -> None:
        """A job cancelled while waiting never ran `timed_job`: give its place back."""
        if future.cancelled():
            with self._lock:
                self._add_waiting(-1)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
