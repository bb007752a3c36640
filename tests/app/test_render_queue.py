"""app/render_queue.py: admission, 503 with Retry-After when full, timing, exceptions,
the gauges, and refusal after shutdown. Jobs block on threading.Events, so nothing here
depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.errors import ApiError
from app.metrics import Metrics
from app.render_queue import PixelBudget, RenderQueue, Timed

WAIT = 30  # seconds: an upper bound for events that should happen at once


PIXELS = 1_000_000


async def run(queue: RenderQueue, job, receive=None, pixels: int = 1000):
    """Run one job as the /sketch route does."""
    return await queue.run(job, pixels=pixels, receive=receive)


class FakeConnection:
    """An ASGI receive channel after the body was read: it answers http.disconnect once
    `leave()` is called, and blocks until then."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    def leave(self) -> None:
        self.gone.set()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def blocking_job(release: threading.Event, started: threading.Event | None = None, value=None):
    def job():
        if started is not None:
            started.set()
        assert release.wait(WAIT), "the test never released the job"
        return value

    return job


async def until(predicate, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def gauge(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name)


def test_full_queue_refuses_with_retry_after_then_admits_again():
    async def scenario():
        metrics = Metrics()
        queue = RenderQueue(workers=1, max_queue=0, max_concurrent_pixels=PIXELS, metrics=metrics, backend="cpu")
        release, started = threading.Event(), threading.Event()
        try:
            first = asyncio.create_task(run(queue, blocking_job(release, started, "first")))
            await until(lambda: queue.running == 1)
            assert started.is_set() and queue.waiting == 0
            assert gauge(metrics, "pencil_renders_running") == 1

            with pytest.raises(ApiError) as caught:
                await run(queue, lambda: "second")
            error = caught.value
            assert (error.status, error.code) == (503, "overloaded")
            assert error.detail
            assert int(error.headers["Retry-After"]) >= 1

            release.set()
            result = await first
            assert isinstance(result, Timed) and result.value == "first"
            assert queue.running == 0 and queue.waiting == 0

            third = await run(queue, lambda: "third")
            assert third.value == "third"
            assert gauge(metrics, "pencil_renders_running") == 0
            assert gauge(metrics, "pencil_render_queue_depth") == 0
        finally:
            release.set()
            queue.shutdown()

    asyncio.run(scenario())


def test_waiting_slots_then_refusal():
    async def scenario():
        metrics = Metrics()
        queue = RenderQueue(workers=1, max_queue=2, max_concurrent_pixels=PIXELS, metrics=metrics, backend="cpu")
        release = threading.Event()
        try:
            tasks = [asyncio.create_task(run(queue, blocking_job(release, value=i))) for i in range(3)]
            await until(lambda: queue.running == 1 and queue.waiting == 2)
            assert gauge(metrics, "pencil_render_queue_depth") == 2
            with pytest.raises(ApiError) as caught:
                await run(queue, lambda: None)
            assert caught.value.status == 503
            # Retry-After grows with the queue: ceil(mean run time * (waiting + 1) / workers)
            assert int(caught.value.headers["Retry-After"]) == queue.retry_after_s() >= 1
            release.set()
            results = await asyncio.gather(*tasks)
            assert [r.value for r in results] == [0, 1, 2]
            assert max(r.queue_ms for r in results) > 0  # the later ones waited
            assert queue.waiting == queue.running == 0
        finally:
            release.set()
            queue.shutdown()

    asyncio.run(scenario())


def test_timing_and_metrics():
    async def scenario():
        metrics = Metrics()
        queue = RenderQueue(workers=2, max_queue=4, max_concurrent_pixels=PIXELS, metrics=metrics, backend="cpu")
        try:
            result = await run(queue, lambda: time.sleep(0.02) or 42)
            assert result.value == 42
            assert result.run_ms >= 15
            assert result.queue_ms >= 0
            assert metrics.registry.get_sample_value("pencil_render_seconds_count", {"backend": "cpu"}) == 1
            assert metrics.registry.get_sample_value("pencil_render_seconds_sum", {"backend": "cpu"}) >= 0.015
            assert metrics.registry.get_sample_value("pencil_render_queue_wait_seconds_count") == 1
        finally:
            queue.shutdown()

    asyncio.run(scenario())


def test_job_exceptions_propagate_and_free_the_slot():
    async def scenario():
        queue = RenderQueue(workers=1, max_queue=0, max_concurrent_pixels=PIXELS, metrics=Metrics(), backend="cpu")
        try:

            def failing():
                raise ApiError(400, "corrupt_image", "bad bytes")

            with pytest.raises(ApiError) as caught:
                await run(queue, failing)
            assert caught.value.code == "corrupt_image"
            with pytest.raises(ZeroDivisionError):
                await run(queue, lambda: 1 / 0)
            assert queue.running == queue.waiting == 0
            assert (await run(queue, lambda: "ok")).value == "ok"  # the single slot is free again
        finally:
            queue.shutdown()

    asyncio.run(scenario())


def test_retry_after_is_a_positive_integer():
    queue = RenderQueue(workers=4, max_queue=0, max_concurrent_pixels=PIXELS, metrics=Metrics(), backend="cpu")
    try:
        assert queue.retry_after_s() >= 1
        assert isinstance(queue.retry_after_s(), int)
    finally:
        queue.shutdown()


def test_after_shutdown_jobs_are_refused():
    async def scenario():
        queue = RenderQueue(workers=1, max_queue=2, max_concurrent_pixels=PIXELS, metrics=Metrics(), backend="cpu")
        queue.shutdown()
        with pytest.raises(ApiError) as caught:
            await run(queue, lambda: "late")
        assert (caught.value.status, caught.value.code) == (503, "shutting_down")
        assert int(caught.value.headers["Retry-After"]) >= 1
        assert queue.waiting == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("watched", [False, True])
def test_cancelled_waiter_gives_its_slot_back_and_never_runs(watched):
    async def scenario():
        queue = RenderQueue(workers=1, max_queue=1, max_concurrent_pixels=PIXELS, metrics=Metrics(), backend="cpu")
        release, ran = threading.Event(), threading.Event()
        connection = FakeConnection()
        try:
            running = asyncio.create_task(run(queue, blocking_job(release, value="running")))
            await until(lambda: queue.running == 1)
            waiter = asyncio.create_task(run(queue, ran.set, connection.receive if watched else None))
            await until(lambda: queue.waiting == 1)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert queue.waiting == 0
            release.set()
            assert (await running).value == "running"
            await until(lambda: queue.running == 0, timeout=5)
            assert not ran.is_set()
            assert queue.pixels.in_use == 0
        finally:
            release.set()
            queue.shutdown()

    asyncio.run(scenario())


def test_render_of_a_client_that_left_is_dropped_before_it_starts():
    async def scenario():
        metrics = Metrics()
        queue = RenderQueue(workers=1, max_queue=1, max_concurrent_pixels=PIXELS, metrics=metrics, backend="cpu")
        release, ran = threading.Event(), threading.Event()
        connection = FakeConnection()
        try:
            running = asyncio.create_task(run(queue, blocking_job(release, value="running")))
            await until(lambda: queue.running == 1)
            waiter = asyncio.create_task(run(queue, ran.set, connection.receive))
            await until(lambda: queue.waiting == 1)
            connection.leave()
            with pytest.raises(ApiError) as caught:
                await waiter
            assert (caught.value.status, caught.value.code) == (499, "client_closed_request")
            assert queue.waiting == 0 and gauge(metrics, "pencil_render_queue_depth") == 0
            release.set()
            assert (await running).value == "running"
            await until(lambda: queue.running == 0, timeout=5)
            assert not ran.is_set() and queue.pixels.in_use == 0
        finally:
            release.set()
            queue.shutdown()

    asyncio.run(scenario())


def test_a_client_that_stays_gets_its_render():
    async def scenario():
        queue = RenderQueue(workers=1, max_queue=1, max_concurrent_pixels=PIXELS, metrics=Metrics(), backend="cpu")
        try:
            assert (await run(queue, lambda: "drawn", FakeConnection().receive)).value == "drawn"
        finally:
            queue.shutdown()

    asyncio.run(scenario())


def test_refuse_if_full_reserves_nothing():
    async def scenario():
        queue = RenderQueue(workers=1, max_queue=0, max_concurrent_pixels=PIXELS, metrics=Metrics(), backend="cpu")
        try:
            for _ in range(3):
                queue.refuse_if_full()  # e.g. requests still uploading
            assert queue.waiting == 0 and not queue.is_full()
            assert (await run(queue, lambda: "next")).value == "next"
            queue.shutdown()
            assert queue.is_full()
            with pytest.raises(ApiError) as caught:
                queue.refuse_if_full()
            assert caught.value.code == "shutting_down"
        finally:
            queue.shutdown()

    asyncio.run(scenario())


def test_pixel_budget_is_first_come_first_served():
    """Jobs that fit together run together; a job larger than the whole budget waits for
    all of it, and small jobs arriving after it do not overtake it."""

    async def scenario():
        budget = PixelBudget(100)
        order: list[str] = []

        async def hold(name: str, pixels: int, release: asyncio.Event) -> None:
            weight = await budget.acquire(pixels)
            order.append(name)
            await release.wait()
            budget.release(weight)

        releases = {name: asyncio.Event() for name in ("a", "b", "big", "late")}
        a = asyncio.create_task(hold("a", 70, releases["a"]))
        b = asyncio.create_task(hold("b", 30, releases["b"]))
        await until(lambda: order == ["a", "b"])
        big = asyncio.create_task(hold("big", 250, releases["big"]))  # capped at 100: waits for all
        await asyncio.sleep(0)
        late = asyncio.create_task(hold("late", 10, releases["late"]))
        releases["a"].set()
        await a
        await asyncio.sleep(0.01)
        assert order == ["a", "b"], "a small late job overtook the big one, or the big one ran early"
        releases["b"].set()
        await until(lambda: order == ["a", "b", "big"])
        assert budget.in_use == 100
        releases["big"].set()
        await until(lambda: order == ["a", "b", "big", "late"])
        releases["late"].set()
        await asyncio.gather(b, big, late)
        assert budget.in_use == 0

    asyncio.run(scenario())


def test_cancelled_budget_waiter_lets_the_next_one_in():
    async def scenario():
        budget = PixelBudget(100)
        first = await budget.acquire(80)
        blocked = asyncio.create_task(budget.acquire(50))
        small = asyncio.create_task(budget.acquire(20))
        await asyncio.sleep(0.01)
        assert not blocked.done() and not small.done()  # small waits behind the head
        blocked.cancel()
        assert await small == 20
        budget.release(first)
        budget.release(20)
        assert budget.in_use == 0

    asyncio.run(scenario())
