"""gpu/pool.py without a GPU: `parse_devices`, and `DevicePool` on a fake runtime —
constructor checks, least-loaded placement, interactive-before-batch order, the batch
cap, bounded waiting (timeout, max_waiting), `run()`'s out-of-memory retry and the
`snapshot()` rows. (`Lease.staging` needs pinned CUDA memory and is not tested here.)"""

from __future__ import annotations

import threading
import time

import pytest

from gpu.pool import (
    BATCH,
    INTERACTIVE,
    DeviceOutOfMemory,
    DevicePool,
    PoolBusy,
    parse_devices,
)

GIB = 1 << 30


class FakeOutOfMemory(Exception):
    pass


class FakeStream:
    def __init__(self) -> None:
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


class FakeRuntime:
    """What CupyRuntime offers, recorded in lists instead of calling CUDA."""

    OutOfMemoryError = FakeOutOfMemory

    def __init__(self, count=2, total=16 * GIB, used=0, cap=0):
        self.count, self.total, self.used, self.cap = count, total, used, cap
        self.capped: list[tuple[int, float]] = []
        self.streams: list[tuple[int, FakeStream, bool]] = []
        self.freed: list[int] = []

    def device_count(self) -> int:
        return self.count

    def describe(self, device):
        return f"Fake GPU {device}", self.total

    def new_stream(self, device, urgent=False):
        stream = FakeStream()
        self.streams.append((device, stream, urgent))
        return stream

    def cap_memory(self, device, fraction):
        self.capped.append((device, fraction))

    def memory(self, device):
        return self.used, self.cap

    def free_cached(self, lease):
        self.freed.append(lease.device)


def make_pool(devices=1, streams=1, **kwargs) -> DevicePool:
    return DevicePool(streams_per_device=streams, runtime=FakeRuntime(devices), **kwargs)


def waiting(pool: DevicePool) -> int:
    return pool.snapshot()[0]["waiting"]


def wait_until(condition, timeout=2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.002)


class Acquirer:
    """pool.acquire(priority, timeout) on its own thread; `done` is set once it returns
    or raises (the lease or the error is then in `lease` / `error`)."""

    def __init__(self, pool: DevicePool, priority: int, timeout: float = 2.0):
        self.lease = self.error = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(pool, priority, timeout))
        self.thread.start()

    def _run(self, pool, priority, timeout):
        try:
            self.lease = pool.acquire(priority, timeout)
        except PoolBusy as exc:
            self.error = exc
        finally:
            self.done.set()


# ------------------------------------------------------------------ parse_devices --


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("all", None), ("", None), (" ALL ", None), ("0,1", [0, 1]), (" 1 , 0 ", [1, 0])],
)
def test_parse_devices(spec, expected):
    assert parse_devices(spec) == expected


@pytest.mark.parametrize("spec", ["a", "-1", "0,0", ",", "0,,x"])
def test_parse_devices_rejects(spec):
    with pytest.raises(ValueError):
        parse_devices(spec)


# -------------------------------------------------------------------- constructor --


@pytest.mark.parametrize(
    "kwargs",
    [
        {"streams_per_device": 0},
        {"memory_fraction": 0.0},
        {"memory_fraction": 1.01},
        {"batch_share": 0.0},
        {"batch_share": 1.5},
        {"devices": [2]},  # only 0 and 1 are visible
        {"devices": []},
    ],
)
def test_constructor_rejects(kwargs):
    with pytest.raises(ValueError):
        DevicePool(runtime=FakeRuntime(count=2), **kwargs)


def test_no_visible_device_is_an_error():
    with pytest.raises(ValueError):
        DevicePool(runtime=FakeRuntime(count=0))


def test_constructor_caps_memory_and_makes_leases():
    runtime = FakeRuntime(count=3)
    pool = DevicePool([0, 2], streams_per_device=3, memory_fraction=0.75, runtime=runtime)
    assert runtime.capped == [(0, 0.75), (2, 0.75)]
    assert pool.device_ids == [0, 2]
    assert pool.size == 6
    assert [device for device, _, _ in runtime.streams] == [0] * 6 + [2] * 6  # 2 per lease
    assert [urgent for _, _, urgent in runtime.streams] == [False, True] * 6  # the side stream is urgent
    assert DevicePool(runtime=FakeRuntime(count=2), streams_per_device=4).size == 8


# --------------------------------------------------------------- leasing, placing --


def test_leases_go_to_the_least_loaded_device():
    pool = make_pool(devices=2, streams=2)
    leases = [pool.acquire(timeout=0) for _ in range(4)]
    assert [lease.device for lease in leases] == [0, 1, 0, 1]
    assert len({id(lease) for lease in leases}) == 4
    assert [row["leases_in_use"] for row in pool.snapshot()] == [2, 2]
    with pytest.raises(PoolBusy):
        pool.acquire(timeout=0)

    pool.release(leases[1])  # device 1 now holds 1, device 0 holds 2
    again = pool.acquire(timeout=0)
    assert again.device == 1
    assert again in leases  # the freed slot is reused, not a new one
    for lease in [leases[0], leases[2], leases[3], again]:
        pool.release(lease)
    assert [row["leases_in_use"] for row in pool.snapshot()] == [0, 0]
    assert [row["leases_granted"] for row in pool.snapshot()] == [2, 3]


def test_lease_context_manager_releases_on_error():
    pool = make_pool()
    with pytest.raises(KeyError), pool.lease() as lease:
        assert pool.snapshot()[0]["leases_in_use"] == 1
        raise KeyError(lease.slot)
    assert pool.snapshot()[0]["leases_in_use"] == 0


def test_interactive_waiter_is_served_before_an_earlier_batch_waiter():
    pool = make_pool(devices=1, streams=1)
    held = pool.acquire(timeout=0)
    batch = Acquirer(pool, BATCH)
    wait_until(lambda: waiting(pool) == 1)
    interactive = Acquirer(pool, INTERACTIVE)
    wait_until(lambda: waiting(pool) == 2)

    pool.release(held)
    assert interactive.done.wait(2)
    assert interactive.lease is held and interactive.lease.priority == INTERACTIVE
    assert not batch.done.is_set()

    pool.release(interactive.lease)
    assert batch.done.wait(2)
    assert batch.lease is held and batch.lease.priority == BATCH
    pool.release(batch.lease)
    for acquirer in (batch, interactive):
        acquirer.thread.join(2)


def test_batch_work_holds_at_most_its_share():
    pool = make_pool(devices=1, streams=4, batch_share=0.5)
    batch = [pool.acquire(BATCH, timeout=0) for _ in range(2)]
    start = time.monotonic()
    with pytest.raises(PoolBusy):
        pool.acquire(BATCH, timeout=0.2)
    assert time.monotonic() - start >= 0.2
    interactive = pool.acquire(INTERACTIVE, timeout=0)  # two leases are still free
    row = pool.snapshot()[0]
    assert (row["leases_in_use"], row["batch_leases_in_use"], row["waiting"]) == (
        3,
        2,
        0,
    )

    pool.release(batch[0])
    assert pool.snapshot()[0]["batch_leases_in_use"] == 1
    batch[0] = pool.acquire(BATCH, timeout=0)  # under the cap again
    for lease in batch + [interactive]:
        pool.release(lease)
    assert pool.snapshot()[0]["batch_leases_in_use"] == 0


def test_capped_batch_waiter_does_not_block_interactive_work():
    pool = make_pool(devices=1, streams=2, batch_share=0.5)  # 1 batch slot
    batch_held = pool.acquire(BATCH, timeout=0)
    batch_waiter = Acquirer(pool, BATCH)
    wait_until(lambda: waiting(pool) == 1)

    interactive = pool.acquire(INTERACTIVE, timeout=0)  # the free lease is not reserved
    assert not batch_waiter.done.is_set()
    pool.release(interactive)
    assert not batch_waiter.done.wait(0.05)  # a free lease, but batch is at its cap

    pool.release(batch_held)
    assert batch_waiter.done.wait(2)
    assert batch_waiter.lease is not None and batch_waiter.error is None
    pool.release(batch_waiter.lease)
    batch_waiter.thread.join(2)


# ------------------------------------------------------------------ bounded waits --


def test_timeout_raises_pool_busy_and_forgets_the_waiter():
    pool = make_pool()
    held = pool.acquire(timeout=0)
    start = time.monotonic()
    with pytest.raises(PoolBusy):
        pool.acquire(timeout=0.1)
    assert 0.1 <= time.monotonic() - start < 1.0
    assert waiting(pool) == 0
    pool.release(held)
    assert pool.snapshot()[0]["leases_in_use"] == 0  # the lease did not go to a ghost


def test_max_waiting_refuses_at_once():
    pool = make_pool(max_waiting=1)
    held = pool.acquire(timeout=0)
    first = Acquirer(pool, INTERACTIVE)
    wait_until(lambda: waiting(pool) == 1)

    start = time.monotonic()
    with pytest.raises(PoolBusy):
        pool.acquire(timeout=2)
    assert time.monotonic() - start < 0.5
    assert waiting(pool) == 1

    pool.release(held)
    assert first.done.wait(2) and first.lease is held
    pool.release(first.lease)
    first.thread.join(2)


# --------------------------------------------------------------------------- run --


def flaky(failures: int, exc_type: type[Exception] = FakeOutOfMemory):
    """Work that raises `exc_type` on its first `failures` calls, then returns 'done'."""
    calls = []

    def work(lease):
        calls.append(lease)
        if len(calls) <= failures:
            raise exc_type("boom")
        return "done"

    return work, calls


def test_run_returns_the_work_result_on_a_lease():
    pool = make_pool(devices=2, streams=1)

    def work(lease):
        row = pool.snapshot()[lease.device]
        return lease.priority, row["leases_in_use"], row["batch_leases_in_use"]

    assert pool.run(work, priority=BATCH) == (BATCH, 1, 1)
    assert pool.runtime.freed == []
    assert all(row["leases_in_use"] == 0 for row in pool.snapshot())


def test_run_retries_once_after_out_of_memory():
    pool = make_pool()
    work, calls = flaky(1)
    assert pool.run(work) == "done"
    assert len(calls) == 2 and calls[0] is calls[1]  # retried on the same lease
    assert pool.runtime.freed == [0]
    assert pool.snapshot()[0]["leases_in_use"] == 0


def test_run_raises_device_out_of_memory_after_the_retry():
    pool = make_pool()
    work, calls = flaky(2)
    with pytest.raises(DeviceOutOfMemory, match="GPU 0"):
        pool.run(work)
    assert len(calls) == 2
    assert pool.runtime.freed == [0, 0]
    assert pool.snapshot()[0]["leases_in_use"] == 0


@pytest.mark.parametrize("failures_before", [0, 1])
def test_run_lets_other_errors_through(failures_before):
    pool = make_pool()
    error = ValueError("not memory")
    calls = []

    def work(lease):
        calls.append(lease)
        if len(calls) <= failures_before:
            raise FakeOutOfMemory("boom")
        raise error

    with pytest.raises(ValueError) as caught:
        pool.run(work)
    assert caught.value is error
    assert len(calls) == failures_before + 1
    assert pool.runtime.freed == [0] * failures_before
    assert pool.snapshot()[0]["leases_in_use"] == 0


# ---------------------------------------------------------------------- snapshot --


def test_snapshot_rows():
    runtime = FakeRuntime(count=2, total=8 * GIB, used=1234, cap=0)
    pool = DevicePool(streams_per_device=3, runtime=runtime)
    lease = pool.acquire(BATCH, timeout=0)
    rows = pool.snapshot()
    assert rows[0] == {
        "device": 0,
        "name": "Fake GPU 0",
        "leases": 3,
        "leases_in_use": 1,
        "batch_leases_in_use": 1,
        "leases_granted": 1,
        "waiting": 0,
        "memory_used_bytes": 1234,
        "memory_cap_bytes": 8 * GIB,  # no cap from the runtime: the whole card
        "memory_total_bytes": 8 * GIB,
    }
    assert rows[1]["device"] == 1 and rows[1]["leases_in_use"] == 0
    pool.release(lease)
    runtime.cap = 6 * GIB
    assert pool.snapshot()[0]["memory_cap_bytes"] == 6 * GIB
    assert pool.snapshot()[0]["leases_granted"] == 1  # granted counts, never drops


def test_a_free_lease_is_granted_even_when_capped_batch_work_fills_the_queue():
    pool = make_pool(streams=2, batch_share=0.5, max_waiting=1)
    batch = pool.acquire(BATCH, timeout=1)
    capped = Acquirer(pool, BATCH)  # waits: batch may hold one lease of the two
    wait_until(lambda: waiting(pool) == 1)
    interactive = pool.acquire(INTERACTIVE, timeout=0.01)
    assert interactive is not batch
    pool.release(interactive)
    pool.release(batch)
    assert capped.done.wait(2) and capped.lease is not None
    pool.release(capped.lease)


def test_releasing_twice_is_an_error():
    pool = make_pool()
    lease = pool.acquire(timeout=1)
    pool.release(lease)
    with pytest.raises(RuntimeError, match="twice"):
        pool.release(lease)
    assert pool.snapshot()[0]["leases_in_use"] == 0


def test_an_interrupted_wait_leaves_no_waiter_behind(monkeypatch):
    pool = make_pool()
    held = pool.acquire(timeout=1)

    def interrupted(timeout=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(pool._cond, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.acquire(timeout=1)
    monkeypatch.undo()
    assert waiting(pool) == 0
    pool.release(held)
    assert pool.acquire(timeout=0.1) is held  # the slot was not handed to a ghost


def test_the_default_wait_is_the_pools_lease_timeout():
    pool = make_pool(lease_timeout=0.05)
    held = pool.acquire()
    start = time.monotonic()
    with pytest.raises(PoolBusy):
        pool.acquire()
    assert time.monotonic() - start < 1.0
    pool.release(held)
