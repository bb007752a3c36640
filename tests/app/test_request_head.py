"""`pencil-gpu serve` bounds each request's line and headers (app/request_head.py): too large
is 431 at once, too slow (or a connection that never sends a byte) is closed, and neither
holds up other clients. Raw sockets against the real server, as a misbehaving client would."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
from pencil_testkit import free_port, photo_bytes, server_env, server_process, sketch_files

MAX_HEAD = 8192
HEAD_TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> tuple[int, Path]:
    workdir = tmp_path_factory.mktemp("request-head")
    port = free_port()
    env = server_env(
        workdir, port=str(port), max_header_bytes=str(MAX_HEAD), header_timeout_s=str(HEAD_TIMEOUT_S), log_level="info"
    )
    with server_process([sys.executable, "-m", "app.cli", "serve"], workdir, env, f"http://127.0.0.1:{port}"):
        yield port, workdir / "server.log"


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_response(sock: socket.socket) -> bytes:
    """One response (head and a Content-Length body) off a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def healthz_ms(port: int) -> float:
    started = time.perf_counter()
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    return (time.perf_counter() - started) * 1000


def test_an_endless_header_is_cut_at_once_and_others_are_served_meanwhile(server):
    port, log = server
    sent, slowest_ms = 0, 0.0
    started = time.monotonic()
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with pytest.raises(OSError):  # the server answers 431 and closes while we are still sending
            while sent < 64 * 2**20:
                sock.sendall(b"a" * 32768)
                sent += 32768
                if sent % (32 * 32768) == 0:
                    slowest_ms = max(slowest_ms, healthz_ms(port))
            read_all(sock)  # (the 431 is covered below: here the reset may overtake it)
    slowest_ms = max(slowest_ms, healthz_ms(port))
    # Cut long before the 64 MB (what was sent filled the sockets' buffers, several MB on loopback)
    assert time.monotonic() - started < 5 and sent < 16 * 2**20, sent
    assert slowest_ms < 1000
    assert "whose line and headers pass 8192 bytes (431)" in log.read_text()


def test_a_head_just_past_the_limit_gets_the_json_error(server):
    port, _ = server
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD + 100))
        head, _, body = read_all(sock).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large")
    assert json.loads(body) == {
        "error": "headers_too_large",
        "detail": f"the request line and headers are larger than {MAX_HEAD} bytes (PENCIL_MAX_HEADER_BYTES)",
    }


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"], ids=["idle", "half_a_head"])
def test_a_connection_whose_head_does_not_come_in_time_is_closed(server, sent):
    port, log = server
    with connect(port) as sock:
        sock.sendall(sent)
        started = time.monotonic()
        assert read_all(sock) == b""  # closed, nothing answered
        waited = time.monotonic() - started
    assert HEAD_TIMEOUT_S - 0.2 < waited < HEAD_TIMEOUT_S + 2
    if sent:
        assert f"its request line and headers took over {HEAD_TIMEOUT_S:g} s" in log.read_text()


def test_a_kept_alive_connection_gets_a_new_head_clock_for_each_request(server):
    port, _ = server
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(port) as sock:
        for _ in range(3):  # each request's head comes at once, however long the connection lives
            sock.sendall(request)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            time.sleep(HEAD_TIMEOUT_S * 0.6)
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # then a head that stalls
        started = time.monotonic()
        assert read_all(sock) == b""
    assert time.monotonic() - started < HEAD_TIMEOUT_S + 2


def test_bodies_do_not_count_as_head(server):
    port, _ = server
    photo = photo_bytes("astronaut", "png", 600)  # a body far larger than the head limit
    assert len(photo) > 4 * MAX_HEAD
    response = httpx.post(
        f"http://127.0.0.1:{port}/sketch", files=sketch_files(photo, "a.png", "image/png"), timeout=60
    )
    assert response.status_code == 200, response.text


# ---------------------------------------------------------------- connections --

MAX_CONNECTIONS = 24
KEEP_ALIVE_S = 1.0


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> tuple[int, Path]:
    """A server with a small connection cap, a short keep-alive and a head time long enough
    that only the cap closes the idle connections of these tests."""
    workdir = tmp_path_factory.mktemp("connections")
    port = free_port()
    env = server_env(
        workdir,
        port=str(port),
        max_connections=str(MAX_CONNECTIONS),
        keep_alive_s=str(KEEP_ALIVE_S),
        header_timeout_s="60",
        log_level="info",
    )
    with server_process([sys.executable, "-m", "app.cli", "serve"], workdir, env, f"http://127.0.0.1:{port}"):
        yield port, workdir / "server.log"


def closed_by_server(sock: socket.socket, wait_s: float = 0.0) -> bool:
    """Whether the server has closed `sock` (waiting up to `wait_s` for it)."""
    sock.settimeout(wait_s)
    try:
        return sock.recv(65536) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except ConnectionResetError:
        return True


def test_a_kept_alive_connection_is_closed_after_the_keep_alive_time(capped):
    port, _ = capped
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        assert closed_by_server(sock, 10)
    assert KEEP_ALIVE_S - 0.2 < time.monotonic() - started < KEEP_ALIVE_S + 1.5


def test_idle_and_trickling_connections_past_the_cap_are_closed_longest_idle_first(capped):
    """Three times the cap of connections that send nothing, half a head, or a header line now
    and then: the oldest are closed as new ones come, /healthz on fresh connections keeps
    answering at once, and the process never holds more than the cap."""
    port, log = capped
    sockets, slowest_ms = [], 0.0
    try:
        for i in range(3 * MAX_CONNECTIONS):
            sock = connect(port)
            sock.sendall([b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"GET / HTTP/1.1\r\nX-Slow: 1\r\n"][i % 3])
            sockets.append(sock)
            if i % 3 == 2:
                for trickler in sockets[2::3]:  # a header line now and then, as a slowloris client
                    if not closed_by_server(trickler):
                        trickler.sendall(b"X-More: 1\r\n")
            if i % 8 == 0:
                slowest_ms = max(slowest_ms, healthz_ms(port))
        time.sleep(0.3)
        open_ones = [i for i, sock in enumerate(sockets) if not closed_by_server(sock)]
        # /healthz's connections took places too and were closed by their client
        assert len(open_ones) <= MAX_CONNECTIONS
        assert open_ones and min(open_ones) >= len(sockets) - MAX_CONNECTIONS - 1  # the newest stay
        assert slowest_ms < 1000
    finally:
        for sock in sockets:
            sock.close()
    assert "at the connection cap (PENCIL_MAX_CONNECTIONS=24): closed 1 idle connection(s)" in log.read_text()


def test_over_the_cap_with_every_connection_busy_requests_get_503_and_probes_are_answered(capped):
    """Every place taken by an upload in progress: a new request is answered 503 overloaded in
    the API's error shape (Retry-After, Connection: close); /healthz and /readyz still 200."""
    port, _ = capped
    uploads = []
    try:
        for _ in range(MAX_CONNECTIONS):
            sock = connect(port)
            sock.sendall(
                b"POST /sketch HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n"
                + b"\x89PNG"
            )
            uploads.append(sock)
        time.sleep(0.3)
        with connect(port) as sock:
            sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
            head, _, body = read_all(sock).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in head.lower() and b"connection: close" in head.lower()
        assert json.loads(body)["error"] == "overloaded"
        assert "PENCIL_MAX_CONNECTIONS" in json.loads(body)["detail"]
        for probe in ("/healthz", "/readyz"):
            assert httpx.get(f"http://127.0.0.1:{port}{probe}", timeout=5).status_code == 200
        assert not any(closed_by_server(sock) for sock in uploads)  # busy: never closed for room
    finally:
        for sock in uploads:
            sock.close()
    time.sleep(0.3)
    assert httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=5).status_code == 200
