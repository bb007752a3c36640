"""bench/loadgen.py against a stdlib HTTP server in a thread: counts, latency order, non-200s."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import loadgen  # the repository root is on sys.path (pytest `pythonpath`), so spawned clients import it too


class Handler(BaseHTTPRequestHandler):
    """Reads the upload; /busy answers 503, anything else 200 with a fixed body and X-Render-Ms,
    closing the connection after every third answer on it."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and the body go out in two writes

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        busy = self.path == "/busy"
        body = b'{"error": "overloaded"}' if busy else b"drawing" * 100
        self.send_response(503 if busy else 200)
        self.send_header("Content-Length", str(len(body)))
        if not busy:
            self.send_header("X-Render-Ms", "2.5")
            self.send_header("X-Queue-Ms", "0.5")
            self.answered = getattr(self, "answered", 0) + 1  # one handler per connection
            if self.answered % 3 == 0:
                self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def base_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_closed_loop_counts_answers_orders_latencies_and_reconnects(base_url):
    result = loadgen.run(
        f"{base_url}/sketch",
        b"\xff\xd8 not really a jpeg",
        fields={"format": "jpeg"},
        connections=2,
        duration=0.8,
        warmup=0.2,
    )
    assert result.mode == "closed" and result.ok > 10
    assert result.rps == pytest.approx(result.ok / 0.8)
    assert 0 < result.p50_ms <= result.p90_ms <= result.p99_ms <= result.max_ms
    assert result.mean_render_ms == pytest.approx(2.5) and result.mean_queue_ms == pytest.approx(0.5)
    assert result.non_200 == {} and result.errors == {}
    assert result.client_cpu_ms_per_request > 0


def test_open_loop_offers_the_rate_and_counts_503s(base_url):
    result = loadgen.run(f"{base_url}/busy", b"photo", connections=4, duration=0.8, warmup=0.2, rate=100, poisson=False)
    assert result.mode == "open" and result.ok == 0 and result.send_lag_p99_ms < 50
    assert 70 <= result.non_200.get(503, 0) <= 90  # evenly spaced: 80 due in the window
    assert result.errors == {}


def test_multipart_body_carries_the_image_and_fields():
    content_type, body = loadgen.multipart(b"PIXELS", "photo.png", {"texture": "fast"})
    boundary = content_type.split("boundary=")[1].encode()
    assert body.startswith(b"--" + boundary) and body.endswith(b"--" + boundary + b"--\r\n")
    assert b'name="texture"\r\n\r\nfast\r\n' in body
    assert b'filename="photo.png"\r\nContent-Type: image/png\r\n\r\nPIXELS\r\n' in body


def test_extra_headers_go_in_every_request_head():
    request = loadgen.build_request(
        "http://127.0.0.1:8000/sketch?texture=fast",
        b"photo",
        "p.jpg",
        {"format": "jpeg"},
        {"Authorization": "Bearer k"},
    )
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /sketch?texture=fast HTTP/1.1"
    assert b"Authorization: Bearer k" in lines and b"Host: 127.0.0.1:8000" in lines
    assert b"photo" in body and b"Authorization" not in body
    assert b"Authorization" not in loadgen.build_request("http://h/sketch", b"photo", "p.jpg", {})
