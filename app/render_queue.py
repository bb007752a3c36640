"""Renders run off the event loop on a fixed set of worker threads, behind a bounded
queue, within a memory budget, in two lanes so that a small photo never waits for huge ones.

- Lanes: a render of more than `large_render_pixels` (PENCIL_LARGE_RENDER_PIXELS) is
  large, any other is small; each lane is first come, first served, and when a worker
  frees the small lane goes first. Large renders together hold at most `workers - 1`
  workers and at most `max_concurrent_pixels - large_render_pixels` pixels, so a small
  render always finds a worker and its pixels: it waits for small renders ahead of it,
  never for a large one. In return, while the first waiting large render has room in its
  lane, small renders leave it a worker and the pixels it needs, so a stream of small
  photos cannot starve it. With a single worker there is nothing to set aside: the small
  lane goes first whenever the worker frees, so a small render waits for at most the one
  render running, and large ones wait while small ones are queued.
- Memory: a render holds its pixels (output width x height, capped at the budget) of
  `max_concurrent_pixels` (PENCIL_MAX_CONCURRENT_PIXELS) while it runs, and the renders
  running never hold more together, so the CPU backend's memory stays under about 60
  bytes a pixel of the budget (plus the process, ~0.15 GB, and the queued uploads). A
  render larger than the whole budget runs alone. The default budget, PENCIL_MAX_PIXELS + PENCIL_LARGE_RENDER_PIXELS,
  fits the largest photo beside a small one; with a smaller budget a large render of more
  than `budget - large_render_pixels` runs as the only large one and takes pixels from the
  small lane, so small renders may wait for it (the memory bound wins).
- Admission: a render that can start at once always can; otherwise it waits, unless
  `max_queue` renders already wait: then it is refused at once (503 with Retry-After, the
  detail giving the counts). `/sketch` also asks `is_full()` (every worker busy and the
  queue full) before it reads an upload, so an overload costs no upload; a place is only
  taken once the body is in.
- Abandonment: until a worker takes the render, the client's connection is watched (one
  pending `receive()`, no polling); if the client goes away, the render is dropped (499).

All bookkeeping happens on the event loop; worker threads only run jobs. A render counts
as running (the gauge, its worker, its pixels) from the moment it is handed to a worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
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


@dataclass(eq=False)
class _Render:
    """One admitted render: its weight in the pixel budget, its lane, how to hand it to a
    worker, and (once handed over) the worker's future."""

    pixels: int
    large: bool
    submit: Callable[[], Future[Any]]
    dispatched: asyncio.Event = field(default_factory=asyncio.Event)
    future: Future[Any] | None = None


class RenderQueue:
    def __init__(
        self,
        workers: int,
        max_queue: int,
        max_concurrent_pixels: int,
        metrics: Metrics,
        backend: str,
        large_render_pixels: int | None = None,
    ):
        """`large_render_pixels` None: one lane (every render is small)."""
        self.workers, self.max_queue = workers, max_queue
        self.metrics, self.backend = metrics, backend
        self.max_concurrent_pixels = max(1, max_concurrent_pixels)
        self.large_render_pixels = large_render_pixels
        self._large_workers = max(1, workers - 1)
        self._reserve = min(large_render_pixels or 0, self.max_concurrent_pixels)  # pixels kept for small renders
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="render")
        self._closed = False
        self._small: deque[_Render] = deque()
        self._large: deque[_Render] = deque()
        self._running = self._running_large = 0
        self._pixels_in_use = self._large_pixels_in_use = 0
        self._mean_run_s = 0.5  # running estimate for Retry-After

    @property
    def waiting(self) -> int:
        """Renders admitted and not yet handed to a worker: never more than `max_queue`."""
        return len(self._small) + len(self._large)

    @property
    def running(self) -> int:
        return self._running

    @property
    def pixels_in_use(self) -> int:
        return self._pixels_in_use

    def is_large(self, pixels: int) -> bool:
        return self.large_render_pixels is not None and pixels > self.large_render_pixels

    @property
    def closed(self) -> bool:
        """Whether shutdown() has run: nothing more is admitted."""
        return self._closed

    def is_full(self) -> bool:
        """Whether a render arriving now would be refused, whatever its size."""
        return self._closed or (self.waiting >= self.max_queue and self._running >= self.workers)

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained by one place."""
        return max(1, math.ceil(self._mean_run_s * (self.waiting + 1) / self.workers))

    def refuse_if_full(self) -> None:
        """Raise ApiError 503 (with Retry-After) when a render would not be admitted now."""
        if self._closed:
            raise ShuttingDown()
        if self.is_full():
            raise self._overloaded()

    def _overloaded(self) -> ApiError:
        retry = self.retry_after_s()
        return ApiError(
            503,
            "overloaded",
            (
                f"the server is busy ({self._running} renders running, {self.waiting} waiting, at most "
                f"{self.max_queue} may wait); retry in {retry} s"
            ),
            {"Retry-After": str(retry)},
        )

    async def run(self, job: Callable[[], T], pixels: int, receive: Receive | None = None) -> Timed[T]:
        """Admit `job` (503 when it would wait and the queue is full), wait for a worker and
        `pixels` of the budget in its lane, run it on the worker thread and return its
        result; its exceptions propagate. `receive`, the request's ASGI channel once its
        body has been read, tells when the client has gone: a render not yet started is
        then dropped (ApiError 499)."""
        if self._closed:
            raise ShuttingDown()
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # the worker's logs keep this request's id
        admitted = time.perf_counter()
        start_time = 0.0
        started = asyncio.Event()

        def timed_job() -> T:
            nonlocal start_time
            start_time = time.perf_counter()
            loop.call_soon_threadsafe(started.set)
            return job()

        def submit() -> Future[Any]:
            future = self._executor.submit(context.run, timed_job)
            future.add_done_callback(lambda _: self._call_on_loop(loop, self._finished, render))
            return future

        render = _Render(min(pixels, self.max_concurrent_pixels), self.is_large(pixels), submit)
        self._admit(render)
        disconnect = asyncio.ensure_future(self._until_disconnect(receive)) if receive is not None else None
        try:
            if render.future is None:
                await self._first(render.dispatched.wait(), disconnect)
            future = render.future
            if future is None:  # woken without a worker: shutdown
                raise ShuttingDown()
            result = asyncio.wrap_future(future)
            await self._first(started.wait(), disconnect, result)
            if future.cancelled():  # the executor dropped it: shutdown
                raise ShuttingDown()
            value: T = await result
        except BaseException:
            if render.future is None:
                self._withdraw(render)
            else:
                # One not started never runs (its worker and pixels come back); one running finishes.
                render.future.cancel()
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

    # Scheduling: on the event loop only.

    def _admit(self, render: _Render) -> None:
        """Queue `render` in its lane and start what can start; refuse it (503) when it
        would have to wait and `max_queue` renders already do. (Queueing a render never
        lets another one start, so a refused render took nothing from anyone.)"""
        lane = self._large if render.large else self._small
        lane.append(render)
        self._dispatch()
        if render.future is None and self.waiting > self.max_queue:
            lane.remove(render)
            self._dispatch()
            raise self._overloaded()

    def _withdraw(self, render: _Render) -> None:
        """Take a render that never got a worker out of its lane (client gone, cancelled)."""
        lane = self._large if render.large else self._small
        if render in lane:
            lane.remove(render)
            self._dispatch()  # it may have been the large render the small lane made room for

    def _large_lane_has_room(self, render: _Render) -> bool:
        """Whether the large renders running leave `render` a worker and its pixels of their
        share. One larger than the share itself may run when no other large one does."""
        share = max(self.max_concurrent_pixels - self._reserve, render.pixels)
        return self._running_large < self._large_workers and self._large_pixels_in_use + render.pixels <= share

    def _can_start(self, render: _Render) -> bool:
        if self._running >= self.workers or self._pixels_in_use + render.pixels > self.max_concurrent_pixels:
            return False
        if render.large:
            return self._large_lane_has_room(render)
        head = self._large[0] if self._large else None
        if head is None or self.workers == 1 or not self._large_lane_has_room(head):
            return True
        # The first large render waits only for what small renders hold: leave it a worker
        # and its pixels (at least the small lane's reserve stays with the small renders).
        small_pixels = self._pixels_in_use - self._large_pixels_in_use
        return (
            self._running + 1 < self.workers
            and small_pixels + render.pixels <= self.max_concurrent_pixels - self._large_pixels_in_use - head.pixels
        )

    def _dispatch(self) -> None:
        """Hand renders to free workers, the small lane first, each lane in order."""
        while not self._closed:
            if self._small and self._can_start(self._small[0]):
                self._start(self._small.popleft())
            elif self._large and self._can_start(self._large[0]):
                self._start(self._large.popleft())
            else:
                break
        self._update_gauges()

    def _start(self, render: _Render) -> None:
        try:
            render.future = render.submit()
        except RuntimeError:  # the executor was shut down: the server is stopping
            render.dispatched.set()
            return
        self._running += 1
        self._pixels_in_use += render.pixels
        if render.large:
            self._running_large += 1
            self._large_pixels_in_use += render.pixels
        render.dispatched.set()

    def _finished(self, render: _Render) -> None:
        self._running -= 1
        self._pixels_in_use -= render.pixels
        if render.large:
            self._running_large -= 1
            self._large_pixels_in_use -= render.pixels
        self._dispatch()

    def _update_gauges(self) -> None:
        self.metrics.queue_depth.set(self.waiting)
        self.metrics.renders_running.set(self._running)

    @staticmethod
    def _call_on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop has closed: nothing is left to hand out
            pass

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

    def shutdown(self) -> None:
        """Refuse new renders, drop the waiting ones (they answer 503 shutting_down) and
        the ones handed over but not started; the running ones finish."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        for render in (*self._small, *self._large):
            render.dispatched.set()
        self._small.clear()
        self._large.clear()
        self._update_gauges()
