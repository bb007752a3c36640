"""app/rate_limit.py: per-client token buckets on a fake clock: the burst, the refill rate,
the wait told to a refused client, clients independent, and the memory bound."""

from __future__ import annotations

import pytest

from app.rate_limit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate():
    clock = Clock()
    limiter = RateLimiter(rate=2.0, burst=3, clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)  # empty: one token every 0.5 s
    clock.now += 0.25
    assert limiter.take("a") == pytest.approx(0.25)  # half a token so far: refused, not charged
    clock.now += 0.25
    assert limiter.take("a") == 0.0
    assert limiter.take("a") == pytest.approx(0.5)
    clock.now += 100
    assert [limiter.take("a") for _ in range(4)][:3] == [0.0, 0.0, 0.0]  # refilled to the burst, no more


def test_clients_have_their_own_buckets():
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=1, clock=clock)
    assert limiter.take("key:alice") == 0.0
    assert limiter.take("key:alice") > 0
    assert limiter.take("key:bob") == 0.0
    assert limiter.take("address:10.0.0.1") == 0.0


def test_a_sustained_client_gets_the_rate_and_no_more():
    clock = Clock()
    limiter = RateLimiter(rate=10.0, burst=5, clock=clock)
    allowed = 0
    for _ in range(10_000):  # asks every 10 ms for 100 s: 100 a second
        allowed += limiter.take("greedy") == 0.0
        clock.now += 0.01
    assert 1000 <= allowed <= 1005 + 1  # 10 a second for 100 s, plus the first burst


def test_refilled_buckets_are_forgotten_when_there_are_many():
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=2, clock=clock, max_clients=101)
    for n in range(100):
        limiter.take(f"address:{n}")
    limiter.take("busy")
    limiter.take("busy")  # empty now
    clock.now += 1.5  # the others have refilled, "busy" has 1.5 of 2
    limiter.take("address:new")  # over the bound: the full buckets go
    assert len(limiter._buckets) == 2
    assert limiter.take("busy") == 0.0 and limiter.take("busy") > 0  # its state was kept


def test_a_flood_of_limited_clients_stays_bounded():
    clock = Clock()
    limiter = RateLimiter(rate=0.001, burst=1, clock=clock, max_clients=1000)
    for n in range(10_000):
        limiter.take(f"address:{n}")
    assert len(limiter._buckets) <= 1000


def test_nonsense_limits_are_refused():
    with pytest.raises(ValueError):
        RateLimiter(rate=0.0, burst=1)
    with pytest.raises(ValueError):
        RateLimiter(rate=1.0, burst=0)
