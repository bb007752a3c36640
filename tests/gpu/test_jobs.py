"""gpu/jobs.py: what the front doors share; here steady_progress, the progress of one long
call that reports none."""

from __future__ import annotations

import threading
import time

import gpu.jobs
from gpu.jobs import steady_progress


def test_progress_moves_steadily_toward_the_end_without_reaching_it(monkeypatch):
    monkeypatch.setattr(gpu.jobs, "TICK_S", 0.01)
    seen: list[float] = []
    with steady_progress(seen.append, 0.05, 0.9, expected_s=0.2):
        time.sleep(0.5)  # longer than expected: it creeps on
    count = len(seen)
    time.sleep(0.05)
    assert len(seen) == count  # stopped with the block
    assert count >= 10 and seen == sorted(seen) and len(set(seen)) == count  # about 50 ticks, fewer on a busy host
    assert 0.05 < seen[0] < 0.2 and 0.75 < seen[-1] < 0.9
    halfway = [p for p in seen if p < 0.05 + 0.85 * 0.63]
    assert 2 <= len(halfway) <= 0.6 * count  # about the expected time (0.2 of 0.5 s) to cover 63 % of the way


def test_a_progress_that_raises_stops_the_ticking_but_not_the_call(monkeypatch):
    monkeypatch.setattr(gpu.jobs, "TICK_S", 0.01)
    calls = []

    def cancel(fraction: float) -> None:
        calls.append(threading.current_thread().name)
        raise RuntimeError("canceled")

    with steady_progress(cancel, 0.0, 1.0, expected_s=1.0):
        time.sleep(0.2)
    assert calls == ["steady-progress"]
