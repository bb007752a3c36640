"""Renders run off the event loop on a fixed set of worker threads, behind a bounded
queue, within a memory budget.

- Admission: when `workers` renders run and `max_queue` more wait, a new render is refused
  at once (503 with Retry-After). `/sketch` also asks `is_full()` before it reads an
  upload, so an overload costs no upload; a place is only taken once the body is in.
- Memory: each render first takes its pixels from a shared budget
  (`PENCIL_MAX_CONCURRENT_PIXELS`), first come first served, so two 50 MP photos render
  one after the other instead of together, and a large one is not starved by small ones.
- Abandonment: until a worker takes the render, the client's connection is watched (one
  pending `receive()`, no polling); if the client goes away, the render is dropped (499).

All bookkeeping happens on the event loop; worker threads only run jobs.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from app.errors import ApiError
from app.metrics import Metrics

T = TypeVar("T")
Receive = Callable[[], Awaitable[dict[str, Any]]]  # an ASGI receive channel


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A job's result with its queue wait (admission to start) and run time, in ms."""

    value: T
    queue_ms: float
    run_ms: float


class ClientGone(ApiError):
    def __init__(self) -> None:
        super().__init__(499, "client_closed_request", "the client closed the connection before its render started")


class ShuttingDown(ApiError):
    def __init__(self) -> None:
        super().__init__(503, "shutting_down", "the server is shutting down", {"Retry-After": "5"})


class PixelBudget:
    """A first-come-first-served budget of pixels, used from the event loop only. A request
    larger than the whole budget waits until it can have all of it."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._free = capacity
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    async def acquire(self, pixels: int) -> int:
        """Wait for `pixels` (capped at the capacity); returns the amount to `release`."""
        weight = min(pixels, self.capacity)
        if not self._waiters and self._free >= weight:
            self._free -= weight
            return weight
        granted = asyncio.get_running_loop().create_future()
        self._waiters.append((weight, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(weight)  # granted just as we were cancelled: hand it on
            else:
                self._waiters.remove((weight, granted))
                self._grant()  # we may have been the head that blocked the others
            raise
        return weight

    def release(self, weight: int) -> None:
        self._free += weight
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self._waiters[0][0] <= self._free:
            weight, granted = self._waiters.popleft()
            self._free -= weight
            granted.set_result(None)


class RenderQueue:
    def __init__(self, workers: int, max_queue: int, max_concurrent_pixels: int, metrics: Metrics, backend: str):
        self.workers, self.max_queue = workers, max_queue
        self.metrics, self.backend = metrics, backend
        self.pixels = PixelBudget(max_concurrent_pixels)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="render")
        self._closed = False
        self._waiting = 0  # admitted, not started (waiting for pixels or a worker)
        self._running = 0
        self._mean_run_s = 0.5  # running estimate for Retry-After

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> int:
        return self._running

    def is_full(self) -> bool:
        return self._closed or self._waiting + self._running >= self.workers + self.max_queue

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained by one place."""
        return max(1, math.ceil(self._mean_run_s * (self._waiting + 1) / self.workers))

    def refuse_if_full(self) -> None:
        """Raise ApiError 503 (with Retry-After) when a render would not be admitted now."""
        if self._closed:
            raise ShuttingDown()
        if self.is_full():
            retry = self.retry_after_s()
            raise ApiError(
                503,
                "overloaded",
                f"the server is busy ({self._waiting} renders waiting); retry in {retry} s",
                {"Retry-After": str(retry)},
            )

    async def run(self, job: Callable[[], T], pixels: int, receive: Receive | None = None) -> Timed[T]:
        """Admit `job` (503 when full), wait for `pixels` of the budget and a worker, run it
        on the worker thread and return its result; its exceptions propagate. `receive`, the
        request's ASGI channel once its body has been read, tells when the client has gone:
        a render not yet started is then dropped (ApiError 499)."""
        self.refuse_if_full()
        loop = asyncio.get_running_loop()
        admitted = time.perf_counter()
        start_time = 0.0
        counted_as_waiting = True
        self._set_waiting(+1)

        def stop_waiting() -> None:  # on the loop; exactly once, whichever path gets there
            nonlocal counted_as_waiting
            if counted_as_waiting:
                counted_as_waiting = False
                self._set_waiting(-1)

        started = asyncio.Event()

        def on_start() -> None:
            stop_waiting()
            self._running += 1
            self.metrics.renders_running.set(self._running)
            started.set()

        def timed_job() -> T:
            nonlocal start_time
            start_time = time.perf_counter()
            loop.call_soon_threadsafe(on_start)
            try:
                return job()
            finally:
                loop.call_soon_threadsafe(self._job_finished)

        disconnect = asyncio.ensure_future(self._until_disconnect(receive)) if receive is not None else None
        weight, future = 0, None
        try:
            weight = await self._first(self.pixels.acquire(pixels), disconnect) or 0  # no `others`: never None
            future = self._submit(timed_job)
            future.add_done_callback(lambda _: loop.call_soon_threadsafe(self.pixels.release, weight))
            result = asyncio.wrap_future(future)
            await self._first(started.wait(), disconnect, result)
            if future.cancelled():  # the executor dropped it: shutdown
                raise ShuttingDown()
            value = await result
        except BaseException:
            if future is None:
                self.pixels.release(weight)  # 0 when nothing was taken
            else:
                future.cancel()  # a job that has not started will never run; a running one finishes
            if future is None or future.cancelled():
                stop_waiting()
            raise
        finally:
            if disconnect is not None:
                disconnect.cancel()
        run_s = time.perf_counter() - start_time
        queue_s = start_time - admitted
        self._mean_run_s = 0.8 * self._mean_run_s + 0.2 * run_s
        self.metrics.queue_wait.observe(queue_s)
        self.metrics.render_time.labels(self.backend).observe(run_s)
        return Timed(value, queue_s * 1000, run_s * 1000)

    @staticmethod
    async def _until_disconnect(receive: Receive) -> None:
        """Returns when the client disconnects. One pending receive(): after the body, the
        only message left is http.disconnect, so nothing is consumed that the app needs."""
        while (await receive())["type"] != "http.disconnect":
            pass

    @staticmethod
    async def _first(awaitable: Awaitable[T], disconnect: asyncio.Future | None, *others: asyncio.Future) -> T | None:
        """Await `awaitable`, unless the client disconnects first (ClientGone) or one of
        `others` finishes first (then None)."""
        task = asyncio.ensure_future(awaitable)
        watched = {task, *others} | ({disconnect} if disconnect is not None else set())
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        if task in done:
            return task.result()
        task.cancel()
        if disconnect is not None and disconnect in done:
            raise ClientGone()
        return None

    def _submit(self, timed_job: Callable[[], T]) -> Future[T]:
        try:
            return self._executor.submit(contextvars.copy_context().run, timed_job)  # logs keep the request id
        except RuntimeError:  # the executor was shut down: the server is stopping
            raise ShuttingDown() from None

    def _job_finished(self) -> None:
        self._running -= 1
        self.metrics.renders_running.set(self._running)

    def _set_waiting(self, delta: int) -> None:
        self._waiting += delta
        self.metrics.queue_depth.set(self._waiting)

    def shutdown(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
