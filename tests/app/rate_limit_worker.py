"""What a server process does with the host's rate buckets, for tests/app/test_rate_limit.py
to run in processes of its own (a spawned process imports it by this name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.rate_limit import RateLimiter


def take_many(directory: Path, client: str, times: int, results: Any) -> None:
    """Ask `times` times for `client` (a burst of 50, then practically nothing); put the
    number allowed in `results`."""
    buckets = RateLimiter(0.001, 50, directory)
    results.put(sum(buckets.take(client) == 0.0 for _ in range(times)))
