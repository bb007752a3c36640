"""app/render_queue.py: admission, 503 with Retry-After when full (and the counts its
detail gives), timing, exceptions, the gauges, refusal after shutdown, abandonment, the
pixel budget, and the two lanes (a small render never waits for large ones; a large one
is not starved). Jobs block on threading.Events, so nothing here depends on how fast the
machine is."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from app.errors import ApiError
from app.metrics import Metrics
from app.render_queue import RenderQueue, Timed

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
            await until(lambda: queue.running == 1 and started.is_set())  # running: handed to the worker
            assert queue.waiting == 0
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
            assert queue.pixels_in_use == 0
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
            assert not ran.is_set() and queue.pixels_in_use == 0
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


class Held:
    """Jobs that block until the test releases them, recording from their worker threads
    the order they start in and the pixels running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order: list[str] = []
        self.running: set[str] = set()
        self.pixels_running = 0
        self.releases: dict[str, threading.Event] = {}

    def job(self, name: str, pixels: int):
        release = self.releases[name] = threading.Event()

        def job():
            with self.lock:
                self.order.append(name)
                self.running.add(name)
                self.pixels_running += pixels
            try:
                assert release.wait(WAIT), "the test never released the job"
                return name
            finally:
                with self.lock:
                    self.running.discard(name)
                    self.pixels_running -= pixels

        return job

    def release(self, name: str) -> None:
        self.releases[name].set()

    def release_all(self) -> None:
        for release in self.releases.values():
            release.set()


def submit(queue: RenderQueue, held: Held, name: str, pixels: int, receive=None) -> asyncio.Task:
    return asyncio.create_task(queue.run(held.job(name, pixels), pixels=pixels, receive=receive))


def lanes(workers: int, budget: int = 100, large: int | None = 20, max_queue: int = 8) -> RenderQueue:
    return RenderQueue(
        workers=workers,
        max_queue=max_queue,
        max_concurrent_pixels=budget,
        metrics=Metrics(),
        backend="cpu",
        large_render_pixels=large,
    )


@pytest.mark.parametrize(
    ("workers", "budget", "huge_pixels", "huge_running"),
    [
        (2, 100, 80, 1),  # the CPU case: 2 workers, one huge render fills the large lane's pixels
        (3, 1000, 100, 2),  # pixels to spare: the large renders hold all workers but one
    ],
)
def test_a_small_render_does_not_wait_for_huge_ones(workers, budget, huge_pixels, huge_running):
    async def scenario():
        queue = lanes(workers, budget)
        held = Held()
        try:
            huge = [submit(queue, held, f"huge{i}", huge_pixels) for i in range(3)]
            first = [f"huge{i}" for i in range(huge_running)]
            await until(lambda: set(held.order) == set(first) and queue.waiting == 3 - huge_running)
            small = submit(queue, held, "small", 20)
            await until(lambda: "small" in held.order)  # it started while every huge render still holds on
            assert held.running == {*first, "small"}
            held.release("small")
            result = await small
            assert result.value == "small"
            held.release_all()
            assert [r.value for r in await asyncio.gather(*huge)] == ["huge0", "huge1", "huge2"]
            # (renders handed to workers at the same moment start in either order)
            assert held.order[huge_running:] == ["small", *[f"huge{i}" for i in range(huge_running, 3)]]
            assert queue.running == queue.waiting == queue.pixels_in_use == 0
        finally:
            held.release_all()
            queue.shutdown()

    asyncio.run(scenario())


def test_small_renders_keep_a_worker_when_large_ones_are_ready():
    """A large render waiting gets the next worker a small render frees, so a stream of
    small renders cannot starve it; a small render arriving after it waits only for a
    small one."""

    async def scenario():
        queue = lanes(workers=2)
        held = Held()
        try:
            a, b = submit(queue, held, "a", 10), submit(queue, held, "b", 10)
            await until(lambda: held.running == {"a", "b"})
            large = submit(queue, held, "large", 50)
            await until(lambda: queue.waiting == 1)
            c = submit(queue, held, "c", 10)
            await until(lambda: queue.waiting == 2)
            held.release("a")
            await a
            await until(lambda: held.running == {"b", "large"})
            assert queue.waiting == 1  # c waits for b, a small render
            held.release("b")
            await b
            await until(lambda: held.running == {"large", "c"})
            held.release_all()
            await asyncio.gather(large, c)
            assert held.order[2:] == ["large", "c"]
        finally:
            held.release_all()
            queue.shutdown()

    asyncio.run(scenario())


def test_with_one_worker_small_renders_go_first_when_it_frees():
    async def scenario():
        queue = lanes(workers=1)
        held = Held()
        try:
            first = submit(queue, held, "large1", 50)
            await until(lambda: held.running == {"large1"})
            second = submit(queue, held, "large2", 50)
            await until(lambda: queue.waiting == 1)
            small = submit(queue, held, "small", 10)
            await until(lambda: queue.waiting == 2)
            held.release("large1")
            await first
            await until(lambda: held.running == {"small"})
            held.release_all()
            await asyncio.gather(second, small)
            assert held.order == ["large1", "small", "large2"]
        finally:
            held.release_all()
            queue.shutdown()

    asyncio.run(scenario())


def test_pixel_budget_bounds_the_pixels_rendering_at_once():
    """Whatever the mix, the renders running never hold more than the budget together; a
    render larger than the whole budget runs alone; every render runs."""

    sizes = {"a": 60, "b": 50, "c": 30, "d": 150, "e": 8, "f": 5, "g": 70, "h": 9, "i": 40, "j": 20, "k": 25}

    async def scenario():
        queue = lanes(workers=3, budget=100, large=25, max_queue=len(sizes))
        held = Held()
        try:
            tasks = {name: submit(queue, held, name, pixels) for name, pixels in sizes.items()}
            await until(lambda: queue.waiting + queue.running == len(sizes))
            most = 0
            while held.releases.keys() - {name for name, task in tasks.items() if task.done()}:
                # every render handed to a worker has started, and the released ones are gone
                await until(lambda: queue.running == len(held.running) > 0)
                with held.lock:
                    running, pixels = set(held.running), held.pixels_running
                assert pixels <= 100 or running == {"d"}, running
                assert queue.pixels_in_use <= 100
                most = max(most, pixels if running != {"d"} else 0)
                oldest = next(name for name in held.order if name in running)
                held.release(oldest)
                await tasks[oldest]
            assert sorted(held.order) == sorted(sizes)
            assert most > 60  # renders did share the budget
            assert queue.running == queue.waiting == queue.pixels_in_use == 0
        finally:
            held.release_all()
            queue.shutdown()

    asyncio.run(scenario())


def test_a_large_render_whose_client_left_frees_what_small_ones_kept_for_it():
    async def scenario():
        queue = lanes(workers=3)
        held, connection = Held(), FakeConnection()
        try:
            a, b = submit(queue, held, "a", 20), submit(queue, held, "b", 20)
            await until(lambda: held.running == {"a", "b"})
            large = submit(queue, held, "large", 70, connection.receive)  # 40 + 70 > 100: waits for a or b
            small = submit(queue, held, "small", 10)  # would take the last worker and pixels the large one needs
            await until(lambda: queue.waiting == 2)
            connection.leave()
            with pytest.raises(ApiError) as caught:
                await large
            assert caught.value.code == "client_closed_request"
            await until(lambda: "small" in held.running)
            held.release_all()
            await asyncio.gather(a, b, small)
            assert "large" not in held.order
            assert queue.running == queue.waiting == queue.pixels_in_use == 0
        finally:
            held.release_all()
            queue.shutdown()

    asyncio.run(scenario())


def waiting_in(detail: str) -> int:
    match = re.search(r"(\d+) waiting", detail)
    assert match, detail
    return int(match.group(1))


def test_the_overload_detail_counts_the_renders_actually_waiting():
    """A worker idle for want of pixels does not let more than max_queue renders wait (the
    issue saw '18 renders waiting' with a queue limit of 16), and the 503 says how many do."""

    async def scenario():
        queue = lanes(workers=2, large=None, max_queue=2)
        held = Held()
        try:
            first = submit(queue, held, "first", 100)  # holds the whole budget: the other worker idles
            await until(lambda: held.running == {"first"})
            waiting = [submit(queue, held, f"w{i}", 100) for i in range(2)]
            await until(lambda: queue.waiting == 2)
            assert not queue.is_full()  # a worker is free: a render that fits could start at once
            with pytest.raises(ApiError) as caught:
                await queue.run(lambda: None, pixels=100)
            error = caught.value
            assert (error.status, error.code) == (503, "overloaded")
            assert waiting_in(error.detail) == queue.waiting == queue.max_queue == 2
            assert "1 renders running" in error.detail and "at most 2 may wait" in error.detail
            assert queue.waiting == 2 and queue.running == 1  # the refused render took nothing

            held.release_all()
            await asyncio.gather(first, *waiting)
        finally:
            held.release_all()
            queue.shutdown()

    asyncio.run(scenario())


def test_the_overload_detail_before_the_upload_counts_the_renders_waiting():
    async def scenario():
        queue = lanes(workers=2, max_queue=3)
        held = Held()
        try:
            tasks = [submit(queue, held, f"r{i}", 10) for i in range(5)]
            await until(lambda: queue.running == 2 and queue.waiting == 3)
            assert queue.is_full()
            with pytest.raises(ApiError) as caught:
                queue.refuse_if_full()
            assert waiting_in(caught.value.detail) == queue.waiting == 3
            assert int(caught.value.headers["Retry-After"]) == queue.retry_after_s()
            held.release_all()
            await asyncio.gather(*tasks)
        finally:
            held.release_all()
            queue.shutdown()

    asyncio.run(scenario())


def test_shutdown_answers_the_waiting_renders_of_both_lanes():
    async def scenario():
        metrics = Metrics()
        queue = RenderQueue(
            workers=2, max_queue=4, max_concurrent_pixels=100, metrics=metrics, backend="cpu", large_render_pixels=20
        )
        held = Held()
        try:
            running = [submit(queue, held, "large", 80), submit(queue, held, "small", 20)]
            await until(lambda: held.running == {"large", "small"})
            waiting = [submit(queue, held, "large2", 80), submit(queue, held, "small2", 20)]
            await until(lambda: queue.waiting == 2)
            assert gauge(metrics, "pencil_render_queue_depth") == 2
            queue.shutdown()
            for task in waiting:
                with pytest.raises(ApiError) as caught:
                    await task
                assert caught.value.code == "shutting_down"
            assert queue.waiting == 0 and gauge(metrics, "pencil_render_queue_depth") == 0
            held.release_all()
            assert [r.value for r in await asyncio.gather(*running)] == ["large", "small"]
            assert sorted(held.order) == ["large", "small"]
        finally:
            held.release_all()
            queue.shutdown()

    asyncio.run(scenario())
