"""A webhook receiver for the tests of jobs/webhooks.py and of the job routes: an HTTP
server on localhost that records each POST, and the check a receiver makes of a delivery."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

SECRET = "a-webhook-secret"


class Receiver:
    """An HTTP server on localhost that records each POST (headers, body) and answers the
    statuses of `answers` in turn (then 200)."""

    def __init__(self, answers: list[int] | None = None):
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.answers = list(answers or [])
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.arrived:  # recorded before the answer: a sender that has its answer finds it here
                    receiver.requests.append((dict(self.headers), body))
                    receiver.arrived.notify_all()
                    status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                if status in (301, 302, 303, 307, 308):
                    self.send_header("Location", receiver.url + "/moved")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[tuple[dict[str, str], bytes]]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.requests) >= count, timeout_s), self.requests
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    """make(answers=None) -> a started Receiver; all closed after the test."""
    made: list[Receiver] = []

    def make(answers: list[int] | None = None) -> Receiver:
        made.append(Receiver(answers))
        return made[-1]

    yield make
    for r in made:
        r.close()


def verified(headers: dict[str, str], body: bytes) -> dict:
    """The delivery's JSON, after checking its signature (SECRET) as a receiver would."""
    timestamp = headers["Pencil-Timestamp"]
    expected = "sha256=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["Pencil-Signature"], expected)
    assert abs(time.time() - int(timestamp)) < 60
    return json.loads(body)
