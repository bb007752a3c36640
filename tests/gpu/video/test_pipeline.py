"""gpu/video/pipeline.py: items come out in order, transformed; an error in either thread is
raised in the caller's; stopping early ends both threads."""

from __future__ import annotations

import threading
import time

import pytest

from gpu.video.pipeline import pipelined


def stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name in ("video-decode", "video-draw")]


def test_items_come_out_in_order_and_transformed():
    def slow_square(x: int) -> int:
        time.sleep(0.001 * (x % 3))
        return x * x

    with pipelined(range(200), slow_square, depth=2) as results:
        assert list(results) == [x * x for x in range(200)]
    assert not stage_threads()


def test_an_error_of_the_source_is_raised_after_the_items_before_it():
    def source():
        yield from range(5)
        raise ValueError("bad packet")

    got = []
    with pytest.raises(ValueError, match="bad packet"), pipelined(source(), lambda x: x) as results:
        for item in results:
            got.append(item)
    assert got == [0, 1, 2, 3, 4] and not stage_threads()


def test_an_error_of_the_transform_is_raised_in_the_caller():
    def transform(x: int) -> int:
        if x == 7:
            raise RuntimeError("draw failed")
        return x

    with pytest.raises(RuntimeError, match="draw failed"), pipelined(range(100), transform) as results:
        assert list(results) == []  # never reached
    assert not stage_threads()


def test_stopping_early_ends_both_threads_even_on_an_endless_source():
    def endless():
        n = 0
        while True:
            yield n
            n += 1

    with pytest.raises(KeyError), pipelined(endless(), lambda x: x) as results:
        for item in results:
            if item == 50:
                raise KeyError("canceled")  # the job's progress raising JobCanceled, say
    assert not stage_threads()
