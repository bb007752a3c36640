"""Decode, draw and encode at once: the source is iterated on one thread, each item
transformed on a second, and the results consumed on the caller's, with small bounded
queues (DEPTH items) between them, so the slowest stage sets the pace and the memory held
is a few frames whatever the clip's length.

An exception in either thread is raised in the caller's, at the item where it happened;
when the caller stops early (an exception of its own, a cancel), both threads stop at
their next item and are joined before `pipelined` returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

DEPTH = 4  # items waiting between two stages (720p RGB: 2.7 MB each)
POLL_S = 0.1  # how often a thread blocked on a full queue looks whether to stop


@dataclass
class _Failed:
    error: BaseException


_END = object()


class _Stage(threading.Thread):
    """One thread of the pipeline: takes items from `take` (or `source`), hands each
    through `transform` to `out`, ends with _END or the _Failed of its error."""

    def __init__(self, name: str, items: Callable[[], Iterator[Any]], transform, out: queue.Queue, stop):
        super().__init__(name=name, daemon=True)
        self.items, self.transform, self.out, self.stop = items, transform, out, stop

    def put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        try:
            for item in self.items():
                if isinstance(item, _Failed):
                    self.put(item)
                    return
                if not self.put(self.transform(item)):
                    return
        except BaseException as exc:  # handed to the caller's thread, which raises it
            self.put(_Failed(exc))
            return
        self.put(_END)


def _drain(source: queue.Queue, stop: threading.Event) -> Iterator[Any]:
    """The items of `source` up to its _END (a _Failed is yielded, then nothing)."""
    while not stop.is_set():
        try:
            item = source.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if item is _END:
            return
        yield item
        if isinstance(item, _Failed):
            return


@contextmanager
def pipelined(source: Iterable[Any], transform: Callable[[Any], Any], depth: int = DEPTH) -> Iterator[Iterator[Any]]:
    """`with pipelined(source, transform) as results:` results yields transform(item) for
    each item of `source`, in order, with source and transform running on their own
    threads."""
    stop = threading.Event()
    read: queue.Queue = queue.Queue(depth)
    done: queue.Queue = queue.Queue(depth)
    stages = [
        _Stage("video-decode", lambda: iter(source), lambda item: item, read, stop),
        _Stage("video-draw", lambda: _drain(read, stop), transform, done, stop),
    ]
    for stage in stages:
        stage.start()

    def results() -> Iterator[Any]:
        for item in _drain(done, stop):
            if isinstance(item, _Failed):
                raise item.error
            yield item

    try:
        yield results()
    finally:
        stop.set()
        for stage in stages:
            stage.join()
