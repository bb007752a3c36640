"""Structured logs (app/logs.py): one access line per request with its fields, X-Request-ID
taken from the client when valid, generated otherwise, returned on every response and on
every log line of the request; the job runner's lines carry the submitter's request id;
the text format; configure_logging's hold on uvicorn's loggers; the store's request_id column."""

from __future__ import annotations

import io
import json
import logging
import os
import sqlite3
import time

import pytest
from pencil_testkit import admin_client, photo_bytes, wait_for_job

from app import logs
from app.metrics import Metrics
from jobs.runner import JobRunner
from jobs.store import JobStore

TOKEN = "test-admin-token-0123"
HEX32 = r"[0-9a-f]{32}"


class Captured:
    """The lines our handler writes, once `capture` has pointed it at a buffer."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def text(self) -> str:
        return self.stream.getvalue()

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.text().splitlines() if line.startswith("{")]

    def access(self) -> list[dict]:
        return [r for r in self.records() if r["logger"] == "pencil.access"]

    def wait_for(self, predicate, timeout_s: float = 30.0) -> list[dict]:
        """The records once one of them satisfies `predicate` (runner threads log after the store says done)."""
        deadline = time.monotonic() + timeout_s
        while not any(predicate(r) for r in self.records()):
            assert time.monotonic() < deadline, self.text()[-3000:]
            time.sleep(0.01)
        return self.records()


@pytest.fixture
def capture():
    """capture(format) -> Captured: the app's log handler, now writing to a buffer (call it
    after the client is made: create_app configures logging anew)."""
    captured = Captured()

    def start(log_format: str = "json") -> Captured:
        logs.configure_logging("info", log_format, stream=captured.stream)
        return captured

    yield start
    logs.configure_logging("warning", "text")  # back to stderr for the tests that follow


def test_access_line_of_a_render_has_the_fields(make_client, capture):
    client = make_client(log_level="info")
    log = capture("json")
    image = photo_bytes(width=64)
    response = client.post("/sketch?max_side=64", content=image, headers={"Content-Type": "image/jpeg"})
    assert response.status_code == 200, response.text
    (line,) = log.access()
    assert set(line) >= {
        "timestamp",
        "level",
        "logger",
        "message",
        "request_id",
        "method",
        "route",
        "path",
        "status",
        "duration_ms",
        "backend",
        "render_ms",
        "queue_ms",
        "bytes",
        "request_bytes",
    }
    assert (line["level"], line["method"], line["route"], line["status"]) == ("INFO", "POST", "/sketch", 200)
    assert line["backend"] == "cpu"
    assert line["request_id"] == response.headers["X-Request-ID"]
    assert line["bytes"] == len(response.content) and line["request_bytes"] == len(image)
    assert line["render_ms"] == float(response.headers["X-Render-Ms"])
    assert line["queue_ms"] == float(response.headers["X-Queue-Ms"])
    assert line["duration_ms"] >= 0 and line["timestamp"].endswith("+00:00") and line["pid"] == os.getpid()


def test_the_route_is_the_template_not_the_path(make_client, capture):
    client = admin_client(make_client, TOKEN, log_level="info")
    log = capture("json")
    assert client.get("/jobs/0123abcd").status_code == 404
    assert client.get("/no/such/page").status_code == 404
    job, unknown = log.access()
    assert (job["route"], job["path"], job["status"]) == ("/jobs/{job_id}", "/jobs/0123abcd", 404)
    assert (unknown["route"], unknown["path"]) == ("unmatched", "/no/such/page")
    assert "render_ms" not in job and job["backend"] == "cpu"


def test_a_given_request_id_comes_back_and_is_on_every_line_of_the_request(make_client, capture):
    client = make_client(log_level="info", raise_server_exceptions=False)

    @client.app.get("/test-boom")
    async def boom():
        logging.getLogger("pencil.test").info("about to fail")
        raise RuntimeError("boom")

    log = capture("json")
    response = client.get("/test-boom", headers={"X-Request-ID": "client-id.42:abc"})
    assert response.status_code == 500 and response.headers["X-Request-ID"] == "client-id.42:abc"
    mine = {r["logger"]: r for r in log.records() if r["logger"] in ("pencil.test", "pencil.errors", "pencil.access")}
    assert len(mine) == 3 and all(r["request_id"] == "client-id.42:abc" for r in mine.values())
    assert mine["pencil.errors"]["level"] == "ERROR" and "RuntimeError: boom" in mine["pencil.errors"]["exc_info"]
    assert mine["pencil.access"]["status"] == 500


@pytest.mark.parametrize("bad", ["has spaces", "x" * 129, "semi;colon", "ünïcode".encode()])
def test_a_bad_request_id_is_replaced(make_client, capture, bad):
    client = make_client(log_level="info")
    log = capture("json")
    response = client.get("/healthz", headers={"X-Request-ID": bad})
    given = response.headers["X-Request-ID"]
    assert given != bad and len(given) == 32 and int(given, 16) >= 0
    assert log.access()[0]["request_id"] == given


def test_a_request_id_is_generated_and_returned_on_every_kind_of_answer(make_client, capture):
    client = make_client(log_level="info", max_upload_bytes=1024)  # admin token unset: /jobs answers 503
    log = capture("json")
    answers = [
        client.get("/healthz"),
        client.post("/sketch", content=b"not an image", headers={"Content-Type": "image/png"}),  # 415
        # 413 from DeclaredLengthGuard, a middleware that answers before any route
        client.post("/sketch", content=b"x" * 10, headers={"Content-Type": "image/png", "Content-Length": str(10**8)}),
        client.get("/jobs"),  # 503
    ]
    assert [r.status_code for r in answers] == [200, 415, 413, 503]
    ids = [r.headers["X-Request-ID"] for r in answers]
    assert len(set(ids)) == 4 and all(len(i) == 32 for i in ids)
    assert [line["request_id"] for line in log.access()] == ids


def test_job_lines_carry_the_request_id_of_the_submission(make_client, capture):
    client = admin_client(make_client, TOKEN, log_level="info")
    log = capture("json")
    spec = {"m": 12, "n": 8, "dtype": "float64", "seed": 0, "kind": "gaussian"}
    response = client.post("/jobs/svd", json={"spec": spec}, headers={"X-Request-ID": "submit-0001"})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert wait_for_job(client, job_id, timeout_s=60)["status"] == "succeeded"
    records = log.wait_for(lambda r: r.get("job_id") == job_id and r.get("status") == "succeeded")
    started, finished = [r for r in records if r.get("job_id") == job_id]
    assert started["message"] == f"job {job_id} (svd) started"
    assert (finished["kind"], finished["status"], finished["level"]) == ("svd", "succeeded", "INFO")
    assert finished["seconds"] >= 0
    assert started["request_id"] == finished["request_id"] == "submit-0001"
    assert client.app.state.jobs.get(job_id).request_id == "submit-0001"


def test_a_failing_job_logs_its_failure_with_the_request_id(tmp_path, capture):
    log = capture("json")
    store = JobStore(tmp_path)
    job, _ = store.create("no-such-kind", {}, request_id="submit-0002")
    runner = JobRunner(store, {}, 1, "cpu", None, Metrics(), 3600.0, log_context=logs.request_context)
    runner.run(store.claim_next())
    lines = [r for r in log.records() if r.get("job_id") == job.id]
    assert [r.get("status") for r in lines] == [None, "failed"]
    assert all(r["request_id"] == "submit-0002" for r in lines)
    assert lines[1]["level"] == "WARNING" and "no job kind" in lines[1]["error"]
    assert logs.current_request_id() is None  # the worker's context is left as it was
    store.close()


def test_text_format_shows_the_request_id_and_the_fields(make_client, capture):
    client = make_client(log_level="info")
    log = capture("text")
    client.get("/healthz", headers={"X-Request-ID": "text-id-1"})
    logging.getLogger("pencil.test").warning("outside any request")
    access, outside = [line for line in log.text().splitlines() if " pencil." in line]
    assert " INFO pencil.access [text-id-1] GET /healthz 200 " in access
    assert "route=/healthz" in access and "status=200" in access and "duration_ms=" in access
    assert outside.endswith(" WARNING pencil.test [-] outside any request")
    assert not log.text().lstrip().startswith("{")


def test_auto_is_text_on_a_terminal_and_json_elsewhere():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert logs.resolve_format("auto", Terminal()) == "text"
    assert logs.resolve_format("auto", io.StringIO()) == "json"
    assert logs.resolve_format("json", Terminal()) == "json"


def test_configure_logging_is_idempotent_and_takes_uvicorns_loggers(capture):
    for _ in range(3):
        log = capture("json")
    ours = [h for h in logging.getLogger().handlers if h.get_name() == "pencil"]
    assert len(ours) == 1
    assert logging.getLogger("uvicorn.error").handlers == [] and logging.getLogger("uvicorn.error").propagate
    assert logging.getLogger("uvicorn.access").propagate is False  # AccessLogMiddleware replaces it
    logging.getLogger("uvicorn.error").info("Started server process [1]")
    (line,) = [r for r in log.records() if r["logger"] == "uvicorn.error"]
    assert line["message"] == "Started server process [1]"


def test_serve_turns_uvicorns_logging_and_access_log_off(monkeypatch, tmp_path):
    import uvicorn

    from app import cli
    from app.config import get_settings

    for key in [k for k in os.environ if k.startswith("PENCIL_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PENCIL_BACKEND", "cpu")
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: calls.append(kwargs))
    try:
        assert cli.main(["serve", "--port", "9123"]) == 0
    finally:
        get_settings.cache_clear()
        logs.configure_logging("warning", "text")
    assert calls[0]["log_config"] is None and calls[0]["access_log"] is False


def test_a_store_made_before_request_ids_gains_the_column(tmp_path):
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:  # the schema before the request_id column
        db.executescript(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, kind TEXT NOT NULL, status TEXT NOT NULL, params TEXT NOT NULL,"
            " created REAL NOT NULL, started REAL, finished REAL, progress REAL NOT NULL DEFAULT 0, error TEXT,"
            " result TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0, idempotency_key TEXT UNIQUE,"
            " request_digest TEXT);"
            "INSERT INTO jobs (id, kind, status, params, created) VALUES ('old', 'svd', 'queued', '{}', 1.0);"
        )
    db.close()
    store = JobStore(tmp_path)
    assert store.get("old").request_id is None and store.get("old").kind == "svd"
    job, _ = store.create("svd", {}, request_id="new-id")
    assert store.get(job.id).request_id == "new-id"
    store.close()
    JobStore(tmp_path).close()  # opening it again adds nothing twice


def test_an_api_key_in_a_logged_query_string_is_redacted(capture):
    """uvicorn logs each WebSocket handshake's path with its query (where /live may carry a key)."""
    captured = capture("text")
    key = "k" * 24
    logging.getLogger("uvicorn.error").info(
        '%s - "WebSocket %s" [accepted]', "127.0.0.1:5555", f"/live?texture=fast&api_key={key}&mode=color"
    )
    logging.getLogger("uvicorn.error").info('%s - "WebSocket %s" 401', "127.0.0.1:5555", f"/live?api_key={key}")
    text = captured.text()
    assert "WebSocket /live?texture=fast&api_key=[redacted]&mode=color" in text
    assert "/live?api_key=[redacted]" in text
    assert key not in text
