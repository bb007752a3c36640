"""app/metrics.py: the registry is per app, and MetricsMiddleware labels requests by
route template so that client-chosen paths cannot grow the label set."""

from __future__ import annotations

from pencil_testkit import metric_samples, metric_value

from app.metrics import Metrics


def test_metric_names():
    names = {family.name for family in Metrics().registry.collect()}
    assert {
        "pencil_http_requests",
        "pencil_http_request_seconds",
        "pencil_http_in_flight",
        "pencil_rejected_requests",
        "pencil_render_queue_wait_seconds",
        "pencil_render_seconds",
        "pencil_render_queue_depth",
        "pencil_renders_running",
    } <= names


def test_two_registries_are_independent():
    a, b = Metrics(), Metrics()
    a.requests.labels("/sketch", "POST", "200").inc()
    assert a.registry is not b.registry
    assert (
        b.registry.get_sample_value(
            "pencil_http_requests_total", {"route": "/sketch", "method": "POST", "status": "200"}
        )
        is None
    )


def test_random_paths_share_one_label(client, rng):
    for _ in range(5):
        client.get(f"/random-{rng.integers(1 << 60)}")
    text = client.get("/metrics").text
    routes = {s.labels["route"] for s in metric_samples(text) if s.name == "pencil_http_requests_total"}
    assert all(not route.startswith("/random-") for route in routes)
    assert metric_value(text, "pencil_http_requests_total", route="unmatched", status="404") == 5


def test_route_templates_of_service_routes(client):
    for path in ("/healthz", "/readyz", "/"):
        client.get(path)
    text = client.get("/metrics").text
    for path in ("/healthz", "/readyz", "/"):
        assert metric_value(text, "pencil_http_requests_total", route=path, method="GET", status="200") == 1
    assert metric_value(text, "pencil_http_request_seconds_count", route="/healthz", method="GET") == 1


def test_docs_are_not_counted_as_unmatched(client):
    client.get("/openapi.json")
    client.get("/docs")
    text = client.get("/metrics").text
    assert metric_value(text, "pencil_http_requests_total", route="unmatched", status="200") is None


def test_in_flight_returns_to_zero(client):
    for _ in range(3):
        client.get("/healthz")
    client.get("/nope")
    assert metric_value(client.get("/metrics").text, "pencil_http_in_flight") == 1  # only the scrape itself
