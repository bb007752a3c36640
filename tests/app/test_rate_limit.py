"""app/rate_limit.py: per-client token buckets shared by the host's processes, on a fake
clock: the burst, the refill rate, the wait told to a refused client, clients independent,
the memory bound, and two processes drawing on one client's bucket."""

from __future__ import annotations

import multiprocessing

import pytest

from app.rate_limit import FILE_NAME, PROBE, SLOT, RateLimiter
from tests.app.rate_limit_worker import take_many


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(tmp_path, rate: float, burst: int, clock=None, slots: int = 1 << 16) -> RateLimiter:
    return RateLimiter(rate, burst, tmp_path, clock or Clock(), slots)


def test_a_burst_then_the_rate(tmp_path):
    clock = Clock()
    buckets = limiter(tmp_path, 2.0, 3, clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)  # empty: one token every 0.5 s
    clock.now += 0.25
    assert buckets.take("a") == pytest.approx(0.25)  # half a token so far: refused, not charged
    clock.now += 0.25
    assert buckets.take("a") == 0.0
    assert buckets.take("a") == pytest.approx(0.5)
    clock.now += 100
    assert [buckets.take("a") for _ in range(4)][:3] == [0.0, 0.0, 0.0]  # refilled to the burst, no more


def test_clients_have_their_own_buckets(tmp_path):
    buckets = limiter(tmp_path, 1.0, 1)
    assert buckets.take("key:alice") == 0.0
    assert buckets.take("key:alice") > 0
    assert buckets.take("key:bob") == 0.0
    assert buckets.take("address:10.0.0.1") == 0.0


def test_a_sustained_client_gets_the_rate_and_no_more(tmp_path):
    clock = Clock()
    buckets = limiter(tmp_path, 10.0, 5, clock)
    allowed = 0
    for _ in range(10_000):  # asks every 10 ms for 100 s: 100 a second
        allowed += buckets.take("greedy") == 0.0
        clock.now += 0.01
    assert 1000 <= allowed <= 1005 + 1  # 10 a second for 100 s, plus the first burst


def test_many_clients_fit_and_refilled_slots_are_taken_again(tmp_path):
    clock = Clock()
    buckets = limiter(tmp_path, 1.0, 1, clock, slots=64)  # a tiny table: 64 slots
    assert all(buckets.take(f"address:{n}") == 0.0 for n in range(40))
    assert (tmp_path / FILE_NAME).stat().st_size == 64 * SLOT.size  # memory does not grow with clients
    clock.now += 2  # everyone has refilled: their slots are free again
    assert all(buckets.take(f"address:{n}") == 0.0 for n in range(100, 140))
    assert buckets.take("address:139") > 0  # its own bucket, now empty


def test_a_flood_of_limited_clients_costs_the_others_at_most_a_shared_bucket(tmp_path):
    clock = Clock()
    buckets = limiter(tmp_path, 0.001, 1, clock, slots=PROBE)  # one probe window: every client meets
    flood = [buckets.take(f"address:{n}") for n in range(1000)]
    assert flood[:PROBE] == [0.0] * PROBE  # each of the first PROBE gets its own slot
    assert all(wait > 0 for wait in flood[PROBE:])  # then they share: limited, never let through


def test_processes_of_the_host_share_a_clients_bucket(tmp_path):
    context = multiprocessing.get_context("spawn")  # fresh processes, as the server's are
    results = context.Queue()
    workers = [context.Process(target=take_many, args=(tmp_path, "key:alice", 40, results)) for _ in range(3)]
    for worker in workers:
        worker.start()
    allowed = sum(results.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(30)
    assert allowed == 50  # 120 asked in three processes: the one burst of 50, not three


def test_nonsense_limits_are_refused(tmp_path):
    with pytest.raises(ValueError):
        RateLimiter(0.0, 1, tmp_path)
    with pytest.raises(ValueError):
        RateLimiter(1.0, 0, tmp_path)


def test_a_bucket_from_before_a_reboot_counts_as_refilled(tmp_path):
    clock = Clock()
    buckets = limiter(tmp_path, 0.001, 1, clock)
    assert buckets.take("a") == 0.0 and buckets.take("a") > 0
    clock.now = 5.0  # CLOCK_MONOTONIC started again below the stored time
    assert buckets.take("a") == 0.0
