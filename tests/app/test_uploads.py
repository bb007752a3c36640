"""Request bodies on the wire (app/uploads.py): the upload timeout (408 upload_timeout) and
early answers (503 overloaded, 413 too_large, ...) that the client reads rather than a reset.

First the guard alone, driven with made-up ASGI messages (each rule, deterministically);
then real uvicorn servers and raw sockets: a server whose one render is held so that every
/sketch is refused before its upload is read, and one with a one-second upload timeout."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import httpx
import pencil_testkit
import pytest
from pencil_testkit import photo_bytes

from app.config import Settings
from app.metrics import Metrics
from app.uploads import UploadGuard

MIB = 1024 * 1024

# ------------------------------------------------------------- the guard alone --


def guard_settings(**overrides) -> Settings:
    values = {
        "backend": "cpu",
        "upload_timeout_s": 0.3,
        "upload_min_bytes_per_s": 0.0,
        "refused_drain_bytes": MIB,
        "refused_drain_s": 1.0,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


def scope(headers: dict[str, str], method: str = "POST") -> dict:
    return {
        "type": "http",
        "method": method,
        "path": "/sketch",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }


class Client:
    """The server's side of one request: `receive` hands out the body in `chunk`-byte
    pieces, `gap_s` apart (a piece of None: wait forever), and counts what was taken."""

    def __init__(self, size: int, chunk: int = 64 * 1024, gap_s: float = 0.0, stall_after: int | None = None):
        self.size, self.chunk, self.gap_s, self.stall_after = size, chunk, gap_s, stall_after
        self.taken = 0
        self.calls = 0
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        self.calls += 1
        if self.taken >= self.size:
            await asyncio.sleep(3600)  # body done: only a disconnect would come
        if self.stall_after is not None and self.taken >= self.stall_after:
            await asyncio.sleep(3600)
        if self.gap_s:
            await asyncio.sleep(self.gap_s)
        piece = min(self.chunk, self.size - self.taken)
        self.taken += piece
        return {"type": "http.request", "body": b"\0" * piece, "more_body": self.taken < self.size}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def status(self) -> int:
        return self.sent[0]["status"]

    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0].get("headers", []))

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])

    def complete(self) -> bool:
        return self.sent[-1]["type"] == "http.response.body" and not self.sent[-1].get("more_body", False)


def refusing_app():
    """An app that answers 503 at once, without reading the body (like /sketch when full)."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"error": "overloaded"}'})

    return app


def reading_app(pause_s: float = 0.0, watch_s: float = 0.0):
    """An app that reads the whole body (pausing `pause_s` between pieces, as a route
    writing to disk would), then waits `watch_s` on receive (as the render queue's watch
    for a client leaving does), then answers 200 with the byte count."""

    async def app(scope, receive, send):
        total = 0
        while True:
            message = await receive()
            total += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
            await asyncio.sleep(pause_s)
        if watch_s:
            try:
                async with asyncio.timeout(watch_s):
                    await receive()
            except TimeoutError:
                pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(total).encode()})

    return app


def run(app, client: Client, headers: dict[str, str], **settings) -> float:
    """Run `app` under the guard for one request; the seconds it took."""
    guard = UploadGuard(app, guard_settings(**settings), Metrics())
    start = time.monotonic()
    asyncio.run(guard(scope(headers), client.receive, client.send))
    return time.monotonic() - start


def test_small_refused_body_is_drained_and_the_connection_kept():
    client = Client(size=700_000)
    run(refusing_app(), client, {"content-length": "700000"})
    assert client.status() == 503 and json.loads(client.body()) == {"error": "overloaded"}
    assert b"connection" not in client.headers()
    assert client.taken == 700_000  # all of it: the connection can carry the next request
    assert client.complete()


def test_large_refused_body_is_drained_up_to_the_limit_then_the_connection_closed():
    client = Client(size=20 * MIB)
    run(refusing_app(), client, {"content-length": str(20 * MIB)})
    assert client.status() == 503 and client.headers()[b"connection"] == b"close"
    assert MIB <= client.taken <= MIB + 64 * 1024  # bounded: not the whole upload
    assert client.complete() and json.loads(client.body()) == {"error": "overloaded"}


def test_the_answer_goes_out_before_the_drain():
    """The whole answer is sent (more_body set) before any of the body is dropped, so a
    client that reads while it sends stops early."""
    client = Client(size=20 * MIB)
    taken_when_answered = []

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            taken_when_answered.append(client.taken)
        client.sent.append(message)

    client.send = send  # type: ignore[method-assign]
    run(refusing_app(), client, {"content-length": str(20 * MIB)})
    assert taken_when_answered == [0]


def test_chunked_refused_body_closes_the_connection():
    client = Client(size=200_000)
    run(refusing_app(), client, {"transfer-encoding": "chunked"})
    assert client.headers()[b"connection"] == b"close"
    assert client.taken == 200_000


def test_expect_100_continue_is_answered_without_asking_for_the_body():
    client = Client(size=20 * MIB)
    run(refusing_app(), client, {"content-length": str(20 * MIB), "expect": "100-continue"})
    assert client.status() == 503 and client.headers()[b"connection"] == b"close"
    assert client.calls == 0  # no receive(): uvicorn sends no 100 Continue, the client no body


def test_drain_is_bounded_in_time():
    client = Client(size=MIB // 2, chunk=1000, gap_s=0.05)  # 20 kB/s: 26 s for the body
    took = run(refusing_app(), client, {"content-length": str(MIB // 2)}, refused_drain_s=0.5)
    assert 0.4 < took < 2.0, took
    assert client.complete() and 0 < client.taken < MIB // 2


def test_no_drain_at_zero_bytes():
    client = Client(size=MIB)
    run(refusing_app(), client, {"content-length": str(MIB)}, refused_drain_bytes=0)
    assert client.headers()[b"connection"] == b"close" and client.taken == 0


def test_a_body_read_to_the_end_is_left_alone():
    client = Client(size=300_000)
    run(reading_app(), client, {"content-length": "300000"})
    assert client.status() == 200 and client.body() == b"300000"
    assert b"connection" not in client.headers() and client.taken == 300_000


def test_request_without_body_is_passed_through():
    client = Client(size=0)
    run(refusing_app(), client, {}, upload_timeout_s=0.01)
    assert client.status() == 503 and client.calls == 0 and b"connection" not in client.headers()


def test_stalled_upload_is_408_and_closes():
    client = Client(size=MIB, stall_after=100_000)
    took = run(reading_app(), client, {"content-length": str(MIB)}, upload_timeout_s=0.3)
    assert client.status() == 408 and client.headers()[b"connection"] == b"close"
    body = json.loads(client.body())
    assert body["error"] == "upload_timeout" and "PENCIL_UPLOAD_TIMEOUT_S" in body["detail"], body
    assert 0.25 < took < 2.0, took


def test_trickle_is_408_by_the_minimum_rate():
    """A byte every 20 ms never idles 0.3 s, but 50 B/s is under the 1000 B/s minimum."""
    client = Client(size=MIB, chunk=1, gap_s=0.02)
    took = run(reading_app(), client, {"content-length": str(MIB)}, upload_timeout_s=0.3, upload_min_bytes_per_s=1000.0)
    body = json.loads(client.body())
    assert client.status() == 408 and body["error"] == "upload_timeout"
    assert "PENCIL_UPLOAD_MIN_BYTES_PER_S" in body["detail"], body
    assert 0.25 < took < 2.0, took


def test_slow_steady_upload_passes():
    """30 kB at 20 kB/s takes 1.5 s, five times the 0.3 s timeout, and passes."""
    client = Client(size=30_000, chunk=1000, gap_s=0.05)
    took = run(reading_app(), client, {"content-length": "30000"}, upload_timeout_s=0.3, upload_min_bytes_per_s=1000.0)
    assert client.status() == 200 and client.body() == b"30000"
    assert took > 1.0


def test_time_the_route_spends_is_not_counted():
    """The route pauses 0.2 s after each piece (6 x the timeout in all); the client is
    never waited for, so no 408."""
    client = Client(size=4_000, chunk=1000)
    run(reading_app(pause_s=0.2), client, {"content-length": "4000"}, upload_timeout_s=0.1, upload_min_bytes_per_s=1e6)
    assert client.status() == 200 and client.body() == b"4000"


def test_receive_after_the_body_is_not_timed():
    """The render queue waits on receive() for a disconnect as long as a render lasts."""
    client = Client(size=1000)
    run(reading_app(watch_s=0.5), client, {"content-length": "1000"}, upload_timeout_s=0.1)
    assert client.status() == 200


def test_route_that_swallows_the_timeout_still_answers_408():
    async def app(scope, receive, send):
        try:
            while (await receive()).get("more_body"):
                pass
        except Exception:
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"oops"})

    client = Client(size=MIB, stall_after=0)
    run(app, client, {"content-length": str(MIB)}, upload_timeout_s=0.1)
    assert client.status() == 408 and [m["type"] for m in client.sent].count("http.response.start") == 1


# ------------------------------------------------------------ real servers --

# A uvicorn server whose renders wait while the file argv[2] exists: with one worker and no
# queue, one held render makes every further /sketch a 503 answered before its upload is read.
HELD_SERVER = """
import sys, time
from pathlib import Path
import uvicorn
import gpu.pencil
hold, real_draw = Path(sys.argv[2]), gpu.pencil.draw_bytes
def held_draw(*args, **kwargs):
    deadline = time.monotonic() + 300
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return real_draw(*args, **kwargs)
gpu.pencil.draw_bytes = held_draw
uvicorn.run("app.main:create_app", factory=True, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""
BODY = 4_000_000  # past the kernel's socket buffers (where a reset shows), under PENCIL_REFUSED_DRAIN_BYTES
LOOPS = 50


@pytest.fixture(scope="module")
def full_server(tmp_path_factory):
    """(base URL, port) of a server whose only render place is taken and held."""
    workdir = tmp_path_factory.mktemp("full")
    hold = workdir / "hold"
    hold.touch()
    port = pencil_testkit.free_port()
    base = f"http://127.0.0.1:{port}"
    env = pencil_testkit.server_env(
        workdir,
        workers="1",
        max_queue="0",
        max_upload_bytes=str(48 * MIB),
        max_job_upload_bytes=str(MIB),
        refused_drain_bytes=str(4 * MIB),
        log_level="warning",
    )
    with pencil_testkit.server_process([sys.executable, "-c", HELD_SERVER, str(port), str(hold)], workdir, env, base):
        held = threading.Thread(
            target=httpx.post,
            args=(f"{base}/sketch",),
            kwargs={"files": pencil_testkit.sketch_files(photo_bytes("coffee", "jpeg", 64)), "timeout": 120},
            daemon=True,
        )
        held.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{base}/healthz", timeout=5).json()["queue"]["running"] < 1:
            assert time.monotonic() < deadline, "the held render never started"
            time.sleep(0.02)
        try:
            yield base, port
        finally:
            hold.unlink()
            held.join(30)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one answer with a Content-Length, skipping a 100 Continue."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed before the answer: {data[:200]!r}"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        if status != 100:
            break
    length = int(headers["content-length"])
    while len(data) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the middle of the answer"
        data += chunk
    return status, headers, data[:length]


def request_head(port: int, length: int, path: str = "/sketch", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: image/jpeg\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def blocking_upload(port: int, length: int, extra: str = "") -> tuple[int, dict[str, str], bytes]:
    """A client that writes its whole request before it reads (as Python's urllib does):
    any reset while it sends fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request_head(port, length, extra=extra) + b"\0" * length)
        return read_answer(sock)


@pytest.mark.parametrize("connection", ["keep-alive", "close"])
def test_refused_upload_gets_the_503_every_time(full_server, connection):
    """Without the drain, a client that says `Connection: close` (like urllib) was reset
    while it sent (about half the time for this size on loopback, every time for 20 MB)."""
    _, port = full_server
    for _ in range(LOOPS):
        status, headers, body = blocking_upload(port, BODY, extra=f"Connection: {connection}\r\n")
        assert status == 503 and json.loads(body)["error"] == "overloaded", body
        assert "retry-after" in headers


def test_urllib_reads_the_503_every_time(full_server):
    base, _ = full_server
    for _ in range(LOOPS):
        request = urllib.request.Request(
            f"{base}/sketch", data=b"\0" * BODY, headers={"Content-Type": "image/jpeg"}, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == 503 and json.loads(caught.value.read())["error"] == "overloaded"


def test_keep_alive_connection_carries_on_after_a_drained_503(full_server):
    _, port = full_server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for _ in range(3):
            sock.sendall(request_head(port, BODY) + b"\0" * BODY)
            status, headers, _ = read_answer(sock)
            assert status == 503 and headers.get("connection") != "close"
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        status, _, body = read_answer(sock)
        assert status == 200 and json.loads(body)["status"] == "ok"


@pytest.mark.parametrize(("length", "status", "code"), [(BODY, 503, "overloaded"), (64 * MIB, 413, "too_large")])
def test_expect_100_continue_gets_the_refusal_instead_of_100(full_server, length, status, code):
    _, port = full_server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request_head(port, length, extra="Expect: 100-continue\r\n"))
        answer, headers, body = read_answer(sock)  # a 100 would be skipped, and the read time out
        assert answer == status and json.loads(body)["error"] == code
        assert headers["connection"] == "close"
        assert sock.recv(1) == b""  # closed: the body is never sent


def send_until(sock: socket.socket, size: int, stop_on_answer: bool) -> int:
    """Send up to `size` zero bytes; stop when the socket fails (the server closed) or,
    with `stop_on_answer`, when an answer can be read. The bytes sent."""
    sock.setblocking(False)
    sent, chunk = 0, b"\0" * 65536
    try:
        while sent < size:
            readable, writable, _ = select.select([sock], [sock], [], 10)
            if stop_on_answer and readable:
                break
            if writable:
                sent += sock.send(chunk[: size - sent])
            elif not readable:
                break  # nothing moves for 10 s
    except (BlockingIOError, ConnectionError):
        pass
    sock.settimeout(20)  # (setblocking(True) would wait forever)
    return sent


def test_large_refused_upload_costs_a_bounded_transfer(full_server):
    """Past PENCIL_REFUSED_DRAIN_BYTES (4 MiB) the server drops that much of a 40 MiB body,
    closes, and the client's sending fails well short of the whole; the 503 is still in its
    socket. (Before the drain, uvicorn read all 40 MiB on a kept-alive connection.)"""
    _, port = full_server
    size = 40 * MIB
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request_head(port, size))
        sent = send_until(sock, size, stop_on_answer=False)
        status, headers, body = read_answer(sock)
    assert sent < 24 * MIB, sent  # 4 MiB drained plus what the sockets' buffers held
    assert status == 503 and json.loads(body)["error"] == "overloaded"
    assert headers["connection"] == "close"


def test_client_reading_while_it_sends_stops_at_the_503(full_server):
    """curl and browsers read while they upload: the answer comes before the body."""
    _, port = full_server
    size = 40 * MIB
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request_head(port, size))
        sent = send_until(sock, size, stop_on_answer=True)
        status, headers, body = read_answer(sock)
    assert status == 503 and json.loads(body)["error"] == "overloaded"
    assert sent < 8 * MIB, sent


def test_declared_too_large_is_413_read_by_the_client(full_server):
    """DeclaredLengthGuard answers before reading too (here PENCIL_MAX_JOB_UPLOAD_BYTES,
    1 MiB); the same drain applies, so a client that writes all its 4 MB reads the 413."""
    _, port = full_server
    for _ in range(LOOPS):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(request_head(port, BODY, path="/jobs/svd", extra="Connection: close\r\n") + b"\0" * BODY)
            status, _, body = read_answer(sock)
        assert status == 413 and json.loads(body)["error"] == "too_large", body


@pytest.fixture(scope="module")
def timeout_server(tmp_path_factory):
    """A server allowing 1 s between pieces of a body and 200 bytes a second at least."""
    with pencil_testkit.live_server(
        tmp_path_factory.mktemp("timeout"),
        upload_timeout_s="1",
        upload_min_bytes_per_s="200",
        admin_token="secret",
        log_level="warning",
    ) as base:
        yield base, int(base.rsplit(":", 1)[1])


def stalled_request(port: int, path: str, head_extra: str, first: bytes, trickle_s: float | None = None):
    """Send a request declaring 1 MB, `first` bytes of it, then nothing (or a byte every
    `trickle_s`); (status, headers, body, seconds to the answer, closed after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {MIB}\r\n{head_extra}\r\n").encode()
        sock.sendall(head + first)
        start = time.monotonic()
        if trickle_s is not None:
            sock.setblocking(False)
            while not select.select([sock], [], [], trickle_s)[0] and time.monotonic() - start < 15:
                sock.send(b"\0")
            sock.settimeout(20)  # (setblocking(True) would wait forever)
        status, headers, body = read_answer(sock)
        took = time.monotonic() - start
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
        return status, headers, body, took, closed


BOUNDARY = "b0undary"
UPLOAD_ROUTES = {
    "/sketch": (
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n",
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n\r\n\xff\xd8\xff'.encode(
            "latin-1"
        ),
    ),
    "/jobs/svd": (
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nAuthorization: Bearer secret\r\n",
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="matrix"; filename="a.npy"\r\n\r\n\x93NUMPY'.encode(
            "latin-1"
        ),
    ),
    "/corpora": ("Content-Type: text/plain\r\nAuthorization: Bearer secret\r\n", b"the first words of a text"),
}


@pytest.mark.parametrize("path", list(UPLOAD_ROUTES))
def test_stalled_upload_is_408_and_closed(timeout_server, path):
    base, port = timeout_server
    extra, first = UPLOAD_ROUTES[path]
    status, headers, body, took, closed = stalled_request(port, path, extra, first)
    assert status == 408, body
    payload = json.loads(body)
    assert set(payload) == {"error", "detail"} and payload["error"] == "upload_timeout", payload
    assert headers["connection"] == "close" and closed
    assert 0.8 < took < 5, took
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert pencil_testkit.metric_value(metrics, "pencil_rejected_requests_total", code="upload_timeout") >= 1


def test_trickled_upload_is_408(timeout_server):
    """A byte every 0.1 s is never idle for the 1 s timeout, but 10 B/s is under 200 B/s."""
    _, port = timeout_server
    extra, first = UPLOAD_ROUTES["/sketch"]
    status, headers, body, took, closed = stalled_request(port, "/sketch", extra, first, trickle_s=0.1)
    assert status == 408 and json.loads(body)["error"] == "upload_timeout", body
    assert "PENCIL_UPLOAD_MIN_BYTES_PER_S" in json.loads(body)["detail"]
    assert headers["connection"] == "close" and closed
    assert 0.8 < took < 5, took


def test_slow_steady_upload_is_drawn(timeout_server):
    """About 3 s for a photo at 2 kB/s, three times the timeout: a slow link, not a stall."""
    _, port = timeout_server
    image = photo_bytes("coffee", "jpeg", 128)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request_head(port, len(image)))
        for offset in range(0, len(image), 100):
            sock.sendall(image[offset : offset + 100])
            time.sleep(0.05)
        status, headers, body = read_answer(sock)
    assert status == 200, body[:300]
    assert headers["content-type"] == "image/png"
