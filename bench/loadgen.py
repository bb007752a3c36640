"""A load generator for an HTTP/1.1 endpoint taking a multipart upload (POST /sketch),
standard library only.

    python bench/loadgen.py --url http://127.0.0.1:8000/sketch --image photo.jpg \\
        --field format=jpeg --field texture=lu --processes 4 --connections 64 --duration 15 [--rate 300]

N client processes (spawned), each an asyncio loop holding its share of the C keep-alive
connections (C counts all processes together), send one request built once: the photo as
the multipart field `image` plus the `--field` options.

- Closed loop (no --rate): each connection sends its next request as soon as the answer to
  the previous one is in; the server is saturated when C exceeds what it runs at once.
- Open loop (--rate R): requests fall due at Poisson (or evenly spaced) times, R/N a
  second in each process; a due request leaves on the next free connection and its
  latency counts from when it was due, so waiting for a connection counts too (no
  coordinated omission). `send lag p99` tells how late requests left the client: the event
  loop's timers add about a millisecond (counted in the latency); more than a few means
  the client limits: give it more connections or processes.

The clock starts once every process has connected. The first `warmup` seconds are not
counted, then `duration` seconds are. Throughput counts the 200 answers completed inside
that window; latencies, statuses and errors are those of the requests due (open) or sent
(closed) inside it, whose answers are awaited past its end (up to --timeout). Latencies are
of 200 answers only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import mimetypes
import multiprocessing
import queue
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

MAX_HEAD = 1 << 16  # bytes of an answer head before it counts as malformed
RETRY_PAUSE_S = 0.05  # after a failed exchange, so a server that is down is not hammered


class ProtocolError(ValueError):
    """An answer this client does not read (chunked, unparsable)."""


@dataclass
class LoadResult:
    """One run's figures. Latencies in ms, rates in requests a second."""

    mode: str  # "closed" (saturated) or "open"
    offered_rps: float | None  # open loop: the offered rate
    processes: int
    connections: int  # all processes together
    duration_s: float  # the measured window
    window: tuple[float, float]  # its start and end, Unix time in s
    ok: int  # 200 answers completed in the window
    rps: float  # ok / duration_s
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_render_ms: float  # X-Render-Ms of the 200 answers (nan when absent)
    mean_queue_ms: float  # X-Queue-Ms of the 200 answers (nan when absent)
    non_200: dict[int, int]  # status -> count
    errors: dict[str, int]  # exception name -> count: refused or dropped connections, timeouts
    send_lag_p99_ms: float  # open loop: p99 of (sent - due); 0 in the closed loop
    client_cpu_ms_per_request: float  # client processes' CPU (user + system) in the window / answers in it


def multipart(image: bytes, filename: str, fields: dict[str, str]) -> tuple[str, bytes]:
    """(Content-Type header value, body) of a form with the file field `image` and `fields`."""
    boundary = uuid.uuid4().hex
    media = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{filename}"\r\n'
            f"Content-Type: {media}\r\n\r\n"
        ).encode()
        + image
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", b"".join(parts)


def build_request(
    url: str, image: bytes, filename: str, fields: dict[str, str], headers: dict[str, str] | None = None
) -> bytes:
    """The whole POST request, head and body, as sent on every exchange; `headers` are
    added to the head (e.g. an API key's Authorization)."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    content_type, body = multipart(image, filename, fields)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n{extra}"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nAccept: */*\r\n\r\n"
    )
    return head.encode() + body


class Connection:
    """One keep-alive HTTP/1.1 connection, opened on first use and again after a close."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._wire: _Wire | None = None

    async def connect(self) -> None:
        _, self._wire = await asyncio.get_running_loop().create_connection(_Wire, self.host, self.port)

    async def exchange(self, request: bytes) -> tuple[int, float | None, float | None]:
        """Send `request`, read the whole answer; (status, X-Render-Ms, X-Queue-Ms)."""
        if (
            self._wire is None or self._wire.transport.is_closing()
        ):  # never opened, or closed (by the server while idle)
            await self.connect()
        status, render_ms, queue_ms, close = await self._wire.exchange(request)
        if close:
            self.close()
        return status, render_ms, queue_ms

    def close(self) -> None:
        if self._wire is not None:
            self._wire.transport.abort()
            self._wire = None


class _Wire(asyncio.Protocol):
    """One TCP connection's protocol. The answer is parsed as it arrives, its head kept and its
    body only counted, not kept; the waiting exchange is woken once, when the answer is
    complete. (asyncio streams would buffer and copy the body and wake the reader for every
    chunk: about twice the client CPU a request.)"""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._answer: asyncio.Future | None = None
        self._head = bytearray()
        self._parsed: tuple[int, float | None, float | None, bool] | None = (
            None  # status, X-Render-Ms, X-Queue-Ms, close
        )
        self._remaining = 0.0  # body bytes still due; inf: until the server closes

    def exchange(self, request: bytes) -> asyncio.Future:
        """Send `request`; a future of (status, X-Render-Ms, X-Queue-Ms, close after it)."""
        self._answer, self._parsed = asyncio.get_running_loop().create_future(), None
        self._head.clear()
        # No drain: the transport sends the rest in the background, so an early answer (a 503
        # before the upload is read) is read at once. One request a connection bounds the buffer.
        self.transport.write(request)
        return self._answer

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.done():  # bytes nobody asked for: the connection is out of step
            self.transport.abort()
            return
        if self._parsed is None:
            received = len(self._head) + len(data)
            self._head += data[:MAX_HEAD]  # room for any head; the body is only counted
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) >= MAX_HEAD:
                    answer.set_exception(ProtocolError(f"answer head longer than {MAX_HEAD} bytes"))
                return
            try:
                self._parsed, length = _parse_head(bytes(self._head[:end]))
            except ValueError as exc:
                answer.set_exception(exc)
                return
            self._remaining = (math.inf if length is None else length) - (received - end - 4)
        else:
            self._remaining -= len(data)
        if self._remaining == 0:
            answer.set_result(self._parsed)
        elif self._remaining < 0:
            answer.set_exception(ProtocolError("more bytes than the answer's Content-Length"))

    def eof_received(self) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            if self._parsed is not None and self._remaining == math.inf:  # a body that ends with the connection
                answer.set_result(self._parsed[:3] + (True,))
            else:
                answer.set_exception(EOFError("the server closed the connection before the answer was complete"))

    def connection_lost(self, exc: Exception | None) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(exc or EOFError("the connection was lost before the answer was complete"))


def _parse_head(head: bytes) -> tuple[tuple[int, float | None, float | None, bool], int | None]:
    """((status, X-Render-Ms, X-Queue-Ms, close after it), Content-Length or None) of an
    answer's head without its final blank line."""
    lines = head.split(b"\r\n")
    status, close = int(lines[0][9:12]), not lines[0].startswith(b"HTTP/1.1")
    length = render_ms = queue_ms = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"x-render-ms":
            render_ms = float(value)
        elif name == b"x-queue-ms":
            queue_ms = float(value)
        elif name == b"connection":
            close = value.strip().lower() == b"close"
        elif name == b"transfer-encoding":
            raise ProtocolError("chunked answers are not read")
    return (status, render_ms, queue_ms, close), length


@dataclass(frozen=True)
class _Plan:
    """What one client process does; times in s, rate in requests a second (this process's share)."""

    host: str
    port: int
    request: bytes
    connections: int
    rate: float | None
    poisson: bool
    offset_s: float  # evenly spaced arrivals: this process's phase
    warmup_s: float
    duration_s: float
    timeout_s: float
    seed: int


async def _drive(plan: _Plan, gate: Callable[[], None]) -> dict:
    """Run one process's connections once `gate()` returns; its raw tallies for the parent to merge."""
    loop = asyncio.get_running_loop()
    now = time.monotonic
    connections = [Connection(plan.host, plan.port) for _ in range(plan.connections)]
    for connection in connections:  # connect before the clock starts; failures retry in the run
        with contextlib.suppress(OSError):
            await connection.connect()
    gate()  # blocking is fine here: nothing else runs yet
    t0 = now()
    unix_offset = time.time() - t0
    start, end = t0 + plan.warmup_s, t0 + plan.warmup_s + plan.duration_s
    latencies: list[float] = []
    lags: list[float] = []
    render_ms: list[float] = []
    queue_ms: list[float] = []
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    ok = answered = 0  # answers completed in the window: 200s, all
    cpu: list[float] = []
    loop.call_at(start, lambda: cpu.append(time.process_time()))
    loop.call_at(end, lambda: cpu.append(time.process_time()))

    async def one(connection: Connection, due: float, sent: float) -> None:
        nonlocal ok, answered
        counted = start <= due < end
        if counted:
            lags.append(sent - due)
        try:
            async with asyncio.timeout(plan.timeout_s):
                status, render, queue = await connection.exchange(plan.request)
        except (OSError, EOFError, ValueError, TimeoutError) as exc:
            connection.close()
            if counted:
                errors[type(exc).__name__] += 1
            await asyncio.sleep(RETRY_PAUSE_S)
            return
        done = now()
        if start <= done <= end:
            answered += 1
            ok += status == 200
        if not counted:
            return
        if status != 200:
            statuses[status] += 1
            return
        latencies.append(done - due)
        if render is not None:
            render_ms.append(render)
        if queue is not None:
            queue_ms.append(queue)

    async def closed(connection: Connection) -> None:
        while (sent := now()) < end:
            await one(connection, sent, sent)

    async def open_loop(connection: Connection, arrivals) -> None:
        for due in arrivals:  # shared by this process's connections: the next free one takes the next due
            delay = due - now()
            if delay > 0:
                await asyncio.sleep(delay)
            await one(connection, due, now())

    if plan.rate is None:
        await asyncio.gather(*(closed(c) for c in connections))
    else:
        arrivals = _arrivals(t0 + plan.offset_s, end, plan.rate, plan.poisson, random.Random(plan.seed))
        await asyncio.gather(*(open_loop(c, arrivals) for c in connections))
    await asyncio.sleep(end - now())  # the window's end marks the CPU time, even when every answer came before it
    for connection in connections:
        connection.close()
    return {
        "latencies": latencies,
        "lags": lags,
        "render_ms": render_ms,
        "queue_ms": queue_ms,
        "statuses": dict(statuses),
        "errors": dict(errors),
        "ok": ok,
        "answered": answered,
        "cpu_s": cpu[1] - cpu[0] if len(cpu) == 2 else math.nan,
        "window": (start + unix_offset, end + unix_offset),
    }


def _arrivals(first: float, end: float, rate: float, poisson: bool, rng: random.Random):
    """Due times (monotonic s) from `first` until `end`, `rate` a second."""
    due, count = first, 0
    while due < end:
        yield due
        count += 1
        due = due + rng.expovariate(rate) if poisson else first + count / rate


def _client(plan: _Plan, gate: Callable[[], None]) -> dict:
    return asyncio.run(_drive(plan, gate))


def _child(target: Callable, args: tuple, results, go) -> None:
    """Body of a process of `spawn_together`: messages (kind, value) on `results`."""

    def gate() -> None:
        results.put(("ready", None))
        go.wait()

    try:
        results.put(("done", target(*args, gate)))
    except BaseException as exc:  # the parent must hear of it rather than wait
        results.put(("failed", repr(exc)))
        raise


def _collect(results, workers: list, kind: str, deadline: float) -> list:
    """One message of `kind` from each process; raises when one fails or exits first, or at `deadline` (monotonic s)."""
    values = []
    while len(values) < len(workers):
        try:
            got, value = results.get(timeout=0.5)
        except queue.Empty:
            dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a child process exited with status {dead[0]}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"child processes not {kind} in time") from None
            continue
        if got == "failed":
            raise RuntimeError(f"a child process failed: {value}")
        values.append(value)
    return values


def spawn_together(
    target: Callable, arguments: list[tuple], timeout: float, started: Callable[[], None] | None = None
) -> list:
    """Run `target(*args, gate)` in one spawned process per args and return their results.
    Each calls `gate()` once ready, which returns when all are, after `started()` here.
    Raises RuntimeError when one fails, TimeoutError past `timeout` s."""
    context = multiprocessing.get_context("spawn")
    results, go = context.Queue(), context.Event()
    workers = [context.Process(target=_child, args=(target, args, results, go), daemon=True) for args in arguments]
    deadline = time.monotonic() + timeout
    try:
        for worker in workers:
            worker.start()
        _collect(results, workers, "ready", deadline)
        go.set()
        if started is not None:
            started()
        return _collect(results, workers, "done", deadline)
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile q (0..1) of an ascending list; nan when empty."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def run(
    url: str,
    image: bytes,
    filename: str = "photo.jpg",
    fields: dict[str, str] | None = None,
    *,
    processes: int = 1,
    connections: int = 1,
    duration: float = 10.0,
    warmup: float = 2.0,
    rate: float | None = None,
    poisson: bool = True,
    timeout: float = 60.0,
    started: Callable[[], None] | None = None,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """Drive `url` with `processes` spawned client processes and `connections` connections in
    all, closed loop or, with `rate` (requests a second), open loop; times in s. `started` is
    called in this process when the clock starts (the warm-up begins); `headers` go in every
    request's head."""
    if connections < processes:
        raise ValueError(f"{connections} connections cannot be spread over {processes} processes")
    target = urlsplit(url)
    request = build_request(url, image, filename, fields or {}, headers)
    plans = [
        _Plan(
            host=target.hostname or "127.0.0.1",
            port=target.port or 80,
            request=request,
            connections=connections // processes + (i < connections % processes),
            rate=None if rate is None else rate / processes,
            poisson=poisson,
            offset_s=0.0 if rate is None else i / rate,
            warmup_s=warmup,
            duration_s=duration,
            timeout_s=timeout,
            seed=random.randrange(1 << 32),
        )
        for i in range(processes)
    ]
    tallies = spawn_together(_client, [(plan,) for plan in plans], 120 + warmup + duration + timeout, started)
    latencies = sorted(x for t in tallies for x in t["latencies"])
    lags = sorted(x for t in tallies for x in t["lags"])
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    for t in tallies:
        statuses.update(t["statuses"])
        errors.update(t["errors"])
    ok = sum(t["ok"] for t in tallies)
    answered = sum(t["answered"] for t in tallies)
    ms = 1000.0
    return LoadResult(
        mode="closed" if rate is None else "open",
        offered_rps=rate,
        processes=processes,
        connections=connections,
        duration_s=duration,
        window=(min(t["window"][0] for t in tallies), max(t["window"][1] for t in tallies)),
        ok=ok,
        rps=ok / duration,
        p50_ms=percentile(latencies, 0.50) * ms,
        p90_ms=percentile(latencies, 0.90) * ms,
        p99_ms=percentile(latencies, 0.99) * ms,
        max_ms=(latencies[-1] if latencies else math.nan) * ms,
        mean_render_ms=_mean([x for t in tallies for x in t["render_ms"]]),
        mean_queue_ms=_mean([x for t in tallies for x in t["queue_ms"]]),
        non_200=dict(sorted(statuses.items())),
        errors=dict(errors),
        send_lag_p99_ms=percentile(lags, 0.99) * ms if rate is not None else 0.0,
        client_cpu_ms_per_request=sum(t["cpu_s"] for t in tallies) / answered * ms if answered else math.nan,
    )


def summary(result: LoadResult) -> str:
    """One line of the main figures."""
    offered = f" at {result.offered_rps:g} req/s offered" if result.offered_rps is not None else " (closed loop)"
    return (
        f"{result.rps:.1f} req/s{offered}: p50 {result.p50_ms:.1f} ms, p90 {result.p90_ms:.1f} ms, "
        f"p99 {result.p99_ms:.1f} ms, max {result.max_ms:.1f} ms; "
        f"X-Render-Ms {result.mean_render_ms:.1f}, X-Queue-Ms {result.mean_queue_ms:.1f}; "
        f"non-200 {result.non_200 or 0}, errors {result.errors or 0}; "
        f"send lag p99 {result.send_lag_p99_ms:.2f} ms; client CPU {result.client_cpu_ms_per_request:.3f} ms/req"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8000/sketch")
    parser.add_argument("--image", type=Path, required=True, help="the file sent as the field `image`")
    parser.add_argument(
        "--field", action="append", default=[], metavar="NAME=VALUE", help="a form field sent with it (repeatable)"
    )
    parser.add_argument("--processes", type=int, default=2, help="client processes [2]")
    parser.add_argument(
        "--connections", type=int, default=64, help="keep-alive connections, all processes together [64]"
    )
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds [15]")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds run before the measurement [2]")
    parser.add_argument(
        "--rate", type=float, default=None, help="open loop at this many requests a second (default: closed loop)"
    )
    parser.add_argument(
        "--arrivals",
        choices=("poisson", "even"),
        default="poisson",
        help="open loop: Poisson or evenly spaced due times [poisson]",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds one exchange may take before it counts as an error [60]"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    fields = dict(field.split("=", 1) for field in args.field)
    result = run(
        args.url,
        args.image.read_bytes(),
        args.image.name,
        fields,
        processes=args.processes,
        connections=args.connections,
        duration=args.duration,
        warmup=args.warmup,
        rate=args.rate,
        poisson=args.arrivals == "poisson",
        timeout=args.timeout,
    )
    print(json.dumps(asdict(result), indent=2) if args.json else summary(result))


if __name__ == "__main__":
    main()
