"""Prometheus metrics of one app instance (own registry, so tests can build many apps),
and the ASGI middleware that counts and times every HTTP request by route template."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobs.store import DATABASE_ERRORS

if TYPE_CHECKING:
    from app.live_slots import LiveSlots
    from gpu.pool import DevicePool
    from jobs.store import JobStore

log = logging.getLogger("pencil.metrics")

_JOB_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)
_RENDER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "pencil_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "pencil_http_request_seconds",
            "HTTP request latency, whole request",
            ["route", "method", "status"],
            buckets=_RENDER_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("pencil_http_in_flight", "HTTP requests being handled now", registry=r)
        self.rejected = Counter(
            "pencil_rejected_requests", "Requests refused with a 4xx/503, by error code", ["code"], registry=r
        )
        self.queue_wait = Histogram(
            "pencil_render_queue_wait_seconds", "Time a render waited for a worker", buckets=_RENDER_BUCKETS, registry=r
        )
        self.render_time = Histogram(
            "pencil_render_seconds",
            "Decode + render + encode time of one render, excluding queue wait",
            ["backend"],
            buckets=_RENDER_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("pencil_render_queue_depth", "Renders waiting for a worker", registry=r)
        self.renders_running = Gauge("pencil_renders_running", "Renders running now", registry=r)
        self.jobs_finished = Counter(
            "pencil_jobs_finished", "Batch jobs that ended, by kind and end state", ["kind", "status"], registry=r
        )
        self.job_queue_wait = Histogram(
            "pencil_job_queue_wait_seconds",
            "Time a batch job waited before it started",
            ["kind"],
            buckets=_JOB_BUCKETS,
            registry=r,
        )
        self.job_run_time = Histogram(
            "pencil_job_run_seconds", "Run time of a batch job", ["kind"], buckets=_JOB_BUCKETS, registry=r
        )

        self.live_frames = Counter(
            "pencil_live_frames",
            "/live frames by outcome: drawn, or error (refused, or the server full)",
            ["outcome"],
            registry=r,
        )
        self.live_latency = Histogram(
            "pencil_live_frame_latency_seconds",
            "/live: a frame's arrival to the start of sending its drawing",
            buckets=_RENDER_BUCKETS,
            registry=r,
        )

    def watch_live(self, slots: LiveSlots) -> None:
        """Export the /live sessions open on this host (read from the slots at each scrape)."""
        self.registry.register(_LiveCollector(slots))

    def watch_jobs(self, store: JobStore) -> None:
        """Export the number of jobs per kind and state (read from the store at each scrape,
        or the last counts read while the store fails, with the failures counted)."""
        self.registry.register(_JobCollector(store))

    def watch_pool(self, pool: DevicePool) -> None:
        """Export the GPU pool's per-device state (read at each scrape)."""
        self.registry.register(_PoolCollector(pool))


class _LiveCollector:
    def __init__(self, slots: LiveSlots) -> None:
        self.slots = slots

    def collect(self) -> Iterator[Metric]:
        sessions = GaugeMetricFamily("pencil_live_sessions", "/live sessions open on this host, all processes")
        sessions.add_metric([], self.slots.held())
        yield sessions
        limit = GaugeMetricFamily("pencil_live_sessions_limit", "PENCIL_MAX_LIVE_SESSIONS")
        limit.add_metric([], self.slots.count)
        yield limit


class _PoolCollector:
    """Per-device gauges of a gpu.pool.DevicePool, read from its snapshot at scrape time."""

    _GAUGES = (
        ("leases", "pencil_gpu_leases", "GPU leases (stream pairs) per device"),
        ("leases_in_use", "pencil_gpu_leases_in_use", "GPU leases held now"),
        ("batch_leases_in_use", "pencil_gpu_batch_leases_in_use", "GPU leases held by batch jobs now"),
        ("memory_used_bytes", "pencil_gpu_memory_used_bytes", "device memory held by the pool's arrays"),
        ("memory_cap_bytes", "pencil_gpu_memory_cap_bytes", "device memory the pool may hold"),
    )

    def __init__(self, pool: DevicePool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        rows = self.pool.snapshot()
        for key, name, help_text in self._GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=["device"])
            for row in rows:
                gauge.add_metric([str(row["device"])], row[key])
            yield gauge
        granted = CounterMetricFamily(
            "pencil_gpu_leases_granted", "GPU leases handed out since start", labels=["device"]
        )
        for row in rows:
            granted.add_metric([str(row["device"])], row["leases_granted"])
        yield granted
        waiting = GaugeMetricFamily("pencil_gpu_lease_waiting", "work waiting for a GPU lease")
        waiting.add_metric([], rows[0]["waiting"] if rows else 0)
        yield waiting


class _JobCollector:
    """Jobs per kind and state, from the store at scrape time. A database error must not
    fail the scrape (the other metrics matter most then): the gauge keeps the last counts
    read, and pencil_job_store_read_failures counts the scrapes that could not read them."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._counts: dict[tuple[str, str], int] = {}
        self._failures = 0

    def collect(self) -> Iterator[Metric]:
        try:
            self._counts = self.store.counts()
        except DATABASE_ERRORS as exc:
            self._failures += 1
            log.warning("metrics: could not read the job counts (%s); exporting the last ones read", exc)
        gauge = GaugeMetricFamily("pencil_jobs", "Batch jobs in the store by kind and state", labels=["kind", "status"])
        for (kind, status), count in sorted(self._counts.items()):
            gauge.add_metric([kind, status], count)
        yield gauge
        yield CounterMetricFamily(
            "pencil_job_store_read_failures",
            "Scrapes that could not read the job counts from the store (pencil_jobs then shows the last read)",
            value=self._failures,
        )


def route_label(scope: Scope, request_scope: Scope) -> str:
    """The path template of the route that handled the request: FastAPI's routes leave it
    in `scope["route"]`; Starlette's (/docs, the /static mount) are matched here against
    `request_scope`, the scope as it arrived (routing rewrites root_path in place)."""
    route = scope.get("route")
    if route is not None:
        return route.path
    app = request_scope.get("app")
    for candidate in getattr(getattr(app, "router", None), "routes", ()):
        path = getattr(candidate, "path", None)
        if isinstance(path, str) and candidate.matches(request_scope)[0] is Match.FULL:
            return path
    return "unmatched"


class MetricsMiddleware:
    """Counts and times requests; the route label is the matched path template (e.g.
    /sketch), or "unmatched", so client-chosen paths cannot blow up the label set."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()
        request_scope = dict(scope)

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.metrics.in_flight.dec()
            route = route_label(scope, request_scope)
            method = scope["method"]
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.latency.labels(route, method, str(status)).observe(time.perf_counter() - start)
