"""Per-client request rates: a token bucket for each client (an API key's name or an address).

Each client's bucket holds at most `burst` tokens and refills at `rate` tokens a second; a
request takes one, or is refused with the seconds until the next one comes. The buckets
live in the server process (it runs on the event loop: no lock), so with several server
processes a client may get up to that many times the rate. Buckets that have refilled
are forgotten once there are many, so a flood of addresses cannot grow memory for good.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_CLIENTS = 100_000  # buckets kept before the full ones are forgotten


class RateLimiter:
    """At most `burst` requests at once and `rate` a second on average, per client."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic, max_clients: int = MAX_CLIENTS
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a rate limit needs rate > 0 and burst >= 1")
        self.rate, self.burst, self.clock, self.max_clients = rate, float(burst), clock, max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, when they were counted)

    def take(self, client: str) -> float:
        """0.0 when `client` may go on (a token taken), else the seconds until it may."""
        now = self.clock()
        tokens, then = self._buckets.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return (1.0 - tokens) / self.rate
        if client not in self._buckets and len(self._buckets) >= self.max_clients:
            self._forget_full(now)
        self._buckets[client] = (tokens - 1.0, now)
        return 0.0

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (the same as never seen); if every client is
        still limited, drop the oldest half (they get a fresh bucket, at worst a burst more)."""
        self._buckets = {
            client: (tokens, then)
            for client, (tokens, then) in self._buckets.items()
            if tokens + (now - then) * self.rate < self.burst
        }
        if len(self._buckets) >= self.max_clients:
            keep = list(self._buckets.items())[len(self._buckets) // 2 :]
            self._buckets = dict(keep)
