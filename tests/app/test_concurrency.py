"""Many requests at once. A real uvicorn server in a subprocess (real sockets, a real
event loop) with one render worker and a queue of two, hit by 32 threads; and an
in-process check where the render is held on an Event, so overload is deterministic."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pencil_testkit
import pytest
from pencil_testkit import assert_api_error, metric_value, photo_bytes, sketch_files

REPO = Path(__file__).resolve().parents[2]
CLIENTS = 32
REQUEST_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    """One render worker and a queue of two, so 32 clients overload it."""
    with pencil_testkit.live_server(
        tmp_path_factory.mktemp("live"), workers="1", max_queue="2", log_level="warning"
    ) as base:
        yield base


def test_live_server_reports_its_settings(live_server):
    body = httpx.get(f"{live_server}/healthz", timeout=10).json()
    assert body["backend"] == "cpu" and body["workers"] == 1 and body["queue"]["limit"] == 2


def test_parallel_requests_get_200_or_503(live_server, rng):
    image = photo_bytes("astronaut", "jpeg", 384, 384, rng=rng)
    barrier = threading.Barrier(CLIENTS)
    results: list[httpx.Response | BaseException | None] = [None] * CLIENTS

    def worker(index: int) -> None:
        try:
            with httpx.Client(base_url=live_server, timeout=REQUEST_TIMEOUT) as client:
                barrier.wait(timeout=REQUEST_TIMEOUT)
                results[index] = client.post("/sketch", files=sketch_files(image, f"p{index}.jpg"))
        except BaseException as exc:  # recorded and asserted on below
            results[index] = exc

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=REQUEST_TIMEOUT + 30)
    assert not any(thread.is_alive() for thread in threads), "some requests hung"

    errors = [r for r in results if not isinstance(r, httpx.Response)]
    assert not errors, errors
    statuses = [r.status_code for r in results]
    assert set(statuses) <= {200, 503}, statuses
    ok = [r for r in results if r.status_code == 200]
    busy = [r for r in results if r.status_code == 503]
    print("statuses", sorted(statuses))
    assert ok, "no request was served"
    assert busy, "32 simultaneous renders with 1 worker and a queue of 2 must shed load"
    for response in ok:
        assert response.headers["x-image-size"] == "384x384"
        assert response.headers["x-backend"] == "cpu"
        assert response.content.startswith(b"\x89PNG")
    for response in busy:
        assert_api_error(response, 503, "overloaded")
        retry_after = response.headers["retry-after"]
        assert retry_after.isdigit() and int(retry_after) > 0

    health = httpx.get(f"{live_server}/healthz", timeout=10)
    assert health.status_code == 200
    assert health.json()["queue"]["waiting"] == 0 and health.json()["queue"]["running"] == 0
    assert httpx.get(f"{live_server}/readyz", timeout=10).status_code == 200

    text = httpx.get(f"{live_server}/metrics", timeout=10).text
    assert metric_value(text, "pencil_http_requests_total", route="/sketch", status="200") >= len(ok)
    assert metric_value(text, "pencil_http_requests_total", route="/sketch", status="503") >= len(busy)
    assert metric_value(text, "pencil_rejected_requests_total", code="overloaded") >= len(busy)

    # and the server still renders afterwards
    after = httpx.post(
        f"{live_server}/sketch", files=sketch_files(photo_bytes("coffee", "jpeg", 96)), timeout=REQUEST_TIMEOUT
    )
    assert after.status_code == 200, after.text


def test_client_that_gives_up_does_not_wedge_the_server(live_server):
    image = photo_bytes("chelsea", "jpeg", 384, rng=None)
    for _ in range(3):
        try:
            httpx.post(f"{live_server}/sketch", files=sketch_files(image), timeout=0.001)
        except httpx.TimeoutException:
            pass
    deadline = time.monotonic() + REQUEST_TIMEOUT
    while True:  # the abandoned renders finish on their own, then the queue is free again
        queue = httpx.get(f"{live_server}/healthz", timeout=10).json()["queue"]
        if queue["waiting"] == 0 and queue["running"] == 0:
            break
        assert time.monotonic() < deadline, queue
        time.sleep(0.05)
    response = httpx.post(f"{live_server}/sketch", files=sketch_files(image), timeout=REQUEST_TIMEOUT)
    assert response.status_code == 200, response.text


# ------------------------------------------------------------- in-process --


@pytest.fixture
def held_renders(monkeypatch):
    """Replace the pencil renderer by one that waits for `release` (and counts starts)."""
    import gpu.pencil

    release = threading.Event()
    started = threading.Semaphore(0)
    real_draw = gpu.pencil.draw_bytes

    def held(data, photo, params, fmt, quality, backend="cpu", pool=None):
        started.release()
        assert release.wait(REQUEST_TIMEOUT), "the test never released the render"
        return real_draw(data, photo, params, fmt, quality, backend, pool)

    monkeypatch.setattr(gpu.pencil, "draw_bytes", held)
    yield release, started
    release.set()


def test_overload_in_process_is_503_with_retry_after(make_client, held_renders):
    release, started = held_renders
    client = make_client(workers=1, max_queue=1)
    image = photo_bytes("coffee", "jpeg", 96)
    responses: dict[int, httpx.Response] = {}

    def send(index: int) -> None:
        responses[index] = client.post("/sketch", files=sketch_files(image))

    running = threading.Thread(target=send, args=(0,), daemon=True)
    running.start()
    assert started.acquire(timeout=REQUEST_TIMEOUT)  # the first render holds the worker
    waiting = threading.Thread(target=send, args=(1,), daemon=True)
    waiting.start()
    deadline = time.monotonic() + REQUEST_TIMEOUT
    while client.get("/healthz").json()["queue"]["waiting"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)

    ready = client.get("/readyz")
    assert ready.status_code == 503 and "render queue is full" in ready.json()["problems"]
    metrics = client.get("/metrics").text
    assert metric_value(metrics, "pencil_http_in_flight") == 3  # two held uploads and this scrape
    assert metric_value(metrics, "pencil_renders_running") == 1
    assert metric_value(metrics, "pencil_render_queue_depth") == 1

    refused = client.post("/sketch", files=sketch_files(image))
    assert_api_error(refused, 503, "overloaded", client)
    assert int(refused.headers["retry-after"]) >= 1

    release.set()
    for thread in (running, waiting):
        thread.join(timeout=REQUEST_TIMEOUT)
        assert not thread.is_alive()
    assert responses[0].status_code == responses[1].status_code == 200
    assert float(responses[1].headers["x-queue-ms"]) > 0
    assert client.get("/readyz").status_code == 200
    assert client.post("/sketch", files=sketch_files(image)).status_code == 200
