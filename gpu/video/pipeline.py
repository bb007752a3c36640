"""Decode, prepare, draw and encode at once: the source is iterated on one thread and each
step after it runs on its own thread (a step may also spread its items over a few worker
threads, its results still in order), with small bounded queues (DEPTH items) between
them, so the slowest step sets the pace and the memory held is a few frames whatever the
clip's length. The caller's thread consumes the last step's results (the encoder).

An exception in any thread is raised in the caller's, at the item where it happened;
when the caller stops early (an exception of its own, a cancel), every thread stops at
its next item and all are joined before `pipelined` returns.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

DEPTH = 4  # items waiting between two steps (720p RGB: 2.7 MB each)
POLL_S = 0.1  # how often a thread blocked on a full queue looks whether to stop


@dataclass(frozen=True)
class Step:
    """One step after the source: `transform` applied to every item, by `workers` threads
    (more than one only for a transform that is thread-safe and releases the GIL for
    most of its work, as FFmpeg's conversions and OpenCV do)."""

    name: str
    transform: Callable[[Any], Any]
    workers: int = 1


@dataclass
class _Failed:
    error: BaseException


_END = object()


class _Stage(threading.Thread):
    """One thread of the pipeline: puts each of `results()` (transformed items, or one
    _Failed that ends them) into `out`, then _END."""

    def __init__(self, name: str, results: Callable[[], Iterator[Any]], out: queue.Queue, stop: threading.Event):
        super().__init__(name=name, daemon=True)
        self.results, self.out, self.stop = results, out, stop

    def put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        results = self.results()
        try:
            for item in results:
                if not self.put(item) or isinstance(item, _Failed):
                    return
        except BaseException as exc:  # handed to the caller's thread, which raises it
            self.put(_Failed(exc))
            return
        finally:
            close = getattr(results, "close", None)  # a generator's (the source may be any iterator)
            if close is not None:
                close()  # a step's worker threads are joined here, not whenever it is collected
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


def _step_results(step: Step, before: queue.Queue, stop: threading.Event) -> Callable[[], Iterator[Any]]:
    """What a step's thread yields: the items of the queue `before`, transformed."""
    return lambda: _transformed(step, _drain(before, stop), stop)


def _transformed(step: Step, items: Iterator[Any], stop: threading.Event) -> Iterator[Any]:
    """step.transform(item) for each of `items`, in order; a _Failed passes through after
    the results of the items before it."""
    if step.workers == 1:
        for item in items:
            yield item if isinstance(item, _Failed) else step.transform(item)
        return
    with ThreadPoolExecutor(step.workers, thread_name_prefix=f"video-{step.name}") as pool:
        pending: deque[Future] = deque()
        failed = None
        try:
            for item in items:
                if isinstance(item, _Failed):
                    failed = item
                    break
                pending.append(pool.submit(step.transform, item))
                if len(pending) > step.workers:  # one queued behind each worker keeps them busy
                    yield pending.popleft().result()
            while pending and not stop.is_set():
                yield pending.popleft().result()
            if failed is not None:
                yield failed
        finally:
            for future in pending:
                future.cancel()


@contextmanager
def pipelined(source: Iterable[Any], steps: Sequence[Step], depth: int = DEPTH) -> Iterator[Iterator[Any]]:
    """`with pipelined(source, steps) as results:` results yields, for each item of
    `source` in order, the item passed through every step's transform in turn; the source
    and each step run on their own threads."""
    stop = threading.Event()
    queues: list[queue.Queue[Any]] = [queue.Queue(depth) for _ in range(len(steps) + 1)]
    stages = [_Stage("video-read", lambda: iter(source), queues[0], stop)]
    for index, step in enumerate(steps):  # step i reads queue i and fills queue i + 1
        stages.append(
            _Stage(
                f"video-{step.name}",
                _step_results(step, queues[index], stop),
                queues[index + 1],
                stop,
            )
        )
    for stage in stages:
        stage.start()

    def results() -> Iterator[Any]:
        for item in _drain(queues[-1], stop):
            if isinstance(item, _Failed):
                raise item.error
            yield item

    try:
        yield results()
    finally:
        stop.set()
        for stage in stages:
            stage.join()
