"""gpu/video/pipeline.py: items come out in order, transformed by every step, also by a step
spread over several workers; an error in any thread is raised in the caller's after the
items before it; stopping early ends every thread."""

from __future__ import annotations

import threading
import time

import pytest

from gpu.video.pipeline import Step, pipelined


def stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("video-")]


def one(transform) -> list[Step]:
    return [Step("draw", transform)]


def test_items_come_out_in_order_and_transformed():
    def slow_square(x: int) -> int:
        time.sleep(0.001 * (x % 3))
        return x * x

    with pipelined(range(200), one(slow_square), depth=2) as results:
        assert list(results) == [x * x for x in range(200)]
    assert not stage_threads()


@pytest.mark.parametrize("workers", [1, 3])
def test_steps_apply_in_turn_and_workers_keep_the_order(workers: int):
    def jittery_double(x: int) -> int:
        time.sleep(0.002 * ((x * 7) % 5))  # later items often finish first
        return 2 * x

    steps = [Step("prepare", jittery_double, workers), Step("draw", lambda x: x + 1)]
    with pipelined(range(120), steps, depth=2) as results:
        assert list(results) == [2 * x + 1 for x in range(120)]
    assert not stage_threads()


def test_a_step_with_workers_runs_them_at_once():
    """Four workers meet at a barrier each round: one worker at a time could never pass it
    (the barrier's timeout breaks it, and the error reaches the caller)."""
    meet = threading.Barrier(4, timeout=10)

    def together(x: int) -> int:
        meet.wait()
        return x

    with pipelined(range(24), [Step("prepare", together, 4)]) as results:
        assert list(results) == list(range(24))


def test_an_error_in_a_worker_comes_after_the_items_before_it():
    def transform(x: int) -> int:
        if x == 9:
            raise ValueError("bad frame")
        time.sleep(0.001 * (x % 4))
        return x

    got = []
    with pytest.raises(ValueError, match="bad frame"), pipelined(range(50), [Step("prepare", transform, 3)]) as results:
        for item in results:
            got.append(item)
    assert got == list(range(9)) and not stage_threads()


def test_an_error_of_the_source_is_raised_after_the_items_before_it():
    def source():
        yield from range(5)
        raise ValueError("bad packet")

    got = []
    with (
        pytest.raises(ValueError, match="bad packet"),
        pipelined(source(), [Step("prepare", lambda x: x, 2)]) as results,
    ):
        for item in results:
            got.append(item)
    assert got == [0, 1, 2, 3, 4] and not stage_threads()


def test_an_error_of_the_transform_is_raised_in_the_caller():
    def transform(x: int) -> int:
        if x == 7:
            raise RuntimeError("draw failed")
        return x

    with pytest.raises(RuntimeError, match="draw failed"), pipelined(range(100), one(transform)) as results:
        assert list(results) == []  # never reached
    assert not stage_threads()


def test_stopping_early_ends_both_threads_even_on_an_endless_source():
    def endless():
        n = 0
        while True:
            yield n
            n += 1

    with (
        pytest.raises(KeyError),
        pipelined(endless(), [Step("prepare", lambda x: x, 3), Step("draw", lambda x: x)]) as results,
    ):
        for item in results:
            if item == 50:
                raise KeyError("canceled")  # the job's progress raising JobCanceled, say
    assert not stage_threads()
