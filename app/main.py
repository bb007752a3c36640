"""The FastAPI application: settings, backend, render queue, routes, page, errors.

`create_app()` is the factory uvicorn runs (`uvicorn --factory app.main:create_app`).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import State
from starlette.middleware.body_limit import RequestBodyLimitResponder
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import corpora, live, sketch
from app.access import AccessGuard
from app.config import Settings, get_settings
from app.docs_pages import DocsPolicy
from app.errors import error_response, install_error_handlers, too_large_detail
from app.jobs import api as jobs_api
from app.jobs.cs256 import CS256_JOB
from app.jobs.search import SEARCH
from app.jobs.stencil import STENCIL
from app.jobs.svd import SVD
from app.jobs.video import VIDEO
from app.live_slots import LiveSlots
from app.logs import AccessLogMiddleware, add_request_id_middleware, configure_logging, request_context
from app.metrics import Metrics, MetricsMiddleware
from app.openapi import document_limits
from app.origins import Cors, allowed_origins
from app.render_queue import RenderQueue
from app.uploads import UploadGuard
from gpu import pencil
from gpu.backend import Backend, BackendUnavailable, select_backend
from gpu.pencil.params import PENCIL_OPTIONS
from gpu.pool import DevicePool, parse_devices
from jobs.runner import JobRunner
from jobs.storage import StartupError, free_bytes, prepare_directory, probe_directory
from jobs.store import DATABASE_ERRORS, JobStore
from jobs.webhooks import WebhookSender

log = logging.getLogger("pencil")

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"  # installed beside app/
MULTIPART_OVERHEAD = 64 * 1024  # form boundaries and option fields on top of the image
JOB_ROUTES = {route.name: route for route in (SVD, STENCIL, CS256_JOB, SEARCH, VIDEO)}
OPENAPI_TAGS = [
    {"name": "sketch", "description": "Photos to pencil drawings."},
    {"name": "jobs", "description": "Batch jobs (SVD, stencil, CS256, search, video): Bearer PENCIL_ADMIN_TOKEN."},
    {"name": "corpora", "description": "Texts stored once for POST /jobs/search: Bearer PENCIL_ADMIN_TOKEN."},
    {"name": "operations", "description": "Liveness, readiness and Prometheus metrics."},
]
# With several server processes on a card, the one running the batch jobs may hold this
# share of PENCIL_GPU_MEMORY_FRACTION (big SVDs, resident corpora); the renders of all of
# them share the rest.
JOB_MEMORY_SHARE = 0.5
DATABASE_ERROR_NOT_READY_S = 30.0  # /readyz says not ready this long after the job database last failed

try:
    VERSION = version("pencil-gpu")
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0+source"


class DeclaredLengthGuard:
    """Answers 413 in our JSON shape when Content-Length already exceeds the limit for the
    path, before any route runs; bodies without a length are cut off by BodyLimit."""

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"")
            limit = self.settings.upload_limit(scope["path"])
            if length.isdigit() and int(length) > limit + MULTIPART_OVERHEAD:
                response = error_response(
                    413,
                    "too_large",
                    too_large_detail(int(length), limit, self.settings.upload_limit_variable(scope["path"])),
                )
                self.metrics.rejected.labels("too_large").inc()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Starlette's request body limit, with the limit of the request's path (the upload
    limit plus room for the multipart framing); over it, a 413 that our handler words."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.settings.upload_limit(scope["path"]) + MULTIPART_OVERHEAD
        await RequestBodyLimitResponder(self.app, limit)(scope, receive, send)


class QuietStartupFailure:
    """A start-up ended by a StartupError has said why in one log line (_start_step): this
    blanks the traceback Starlette hands uvicorn with lifespan.startup.failed, which uvicorn
    would log too, so the operator reads the line, not a stack. uvicorn exits with status 3."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_quietly(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and hasattr(scope["app"].state, "startup_failure"):
                message = {**message, "message": ""}
            await send(message)

        await self.app(scope, receive, send_quietly)


Result = TypeVar("Result")


def _start_step(app: FastAPI, step: Callable[..., Result], *args: Any) -> Result:
    """Run one start-up step; a StartupError is logged as one ERROR line saying what to do
    and marked for QuietStartupFailure, then ends the start."""
    try:
        return step(*args)
    except StartupError as exc:
        log.error("pencil-gpu cannot start: %s", exc)
        app.state.startup_failure = str(exc)
        raise


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    configure_logging(settings.log_level, settings.log_format)
    backend, pool = _backend_and_pool(settings)
    metrics = Metrics()
    if pool is not None:
        metrics.watch_pool(pool)
    # With CUDA, one render thread per GPU lease unless PENCIL_WORKERS says otherwise.
    workers = pool.size if pool is not None and "workers" not in settings.model_fields_set else settings.workers

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The data directory holds the batch jobs' store, the runner's lock and the corpora:
        # it is made only where jobs are on (PENCIL_ADMIN_TOKEN), before the warm-up so that
        # an unusable one stops the start at once. Without jobs nothing is stored.
        jobs_enabled = bool(settings.admin_token)
        if jobs_enabled:
            _start_step(app, prepare_directory, settings.data_dir)
        await asyncio.to_thread(pencil.warm_up, backend.name, pool)
        app.state.warmed_up = True  # /readyz says ready from here on
        store = runner = None
        if jobs_enabled:  # without a token every /jobs and /corpora route answers 503 before it reads these
            store = app.state.jobs = _start_step(
                app,
                JobStore,
                settings.data_dir,
                settings.database_url.get_secret_value() if settings.database_url else None,
                settings.replica_id,
                settings.job_lease_s,
            )
            metrics.watch_jobs(store)
            job_memory = (
                settings.gpu_memory_fraction * JOB_MEMORY_SHARE if pool is not None and settings.processes > 1 else None
            )  # see render_memory_fraction
            runner = app.state.job_runner = JobRunner(
                store,
                {name: route.kind for name, route in JOB_ROUTES.items()},
                settings.job_streams,
                backend.name,
                pool,
                metrics,
                settings.job_retention_days * 86400,
                job_memory,
                request_context,
                WebhookSender(store, settings.webhook_secret.get_secret_value()) if settings.webhook_secret else None,
            )
            runner.start()
        log.info(
            "pencil-gpu %s: backend %s%s, %d render workers, queue %d",
            VERSION,
            backend.name,
            f" on {', '.join(backend.devices)}" if backend.devices else "",
            workers,
            settings.max_queue,
        )
        if settings.admin_token is None:
            log.info("batch jobs are disabled until PENCIL_ADMIN_TOKEN is set")
        yield
        app.state.render_queue.shutdown()
        if runner is not None and store is not None and await asyncio.to_thread(runner.stop):
            store.close()

    # fastapi-offline: a maintained package that bundles the Swagger UI and ReDoc assets and serves
    # /docs and /redoc from the app (under /static-offline-docs), so the docs work with no internet.
    app = FastAPIOffline(
        title="pencil-gpu",
        version=VERSION,
        summary="Photos to pencil drawings (Lu, Xu & Jia 2012) on NVIDIA GPUs or the CPU.",
        description=(
            'Errors are JSON `{"error": code, "detail": sentence}` (and `field` for a parameter) with status '
            "400, 401, 404, 405, 408, 409, 413, 415, 422, 429, 431, 499, 500, 503 or 507 (see POST /sketch and the "
            "jobs' pages for the codes)."
        ),
        openapi_tags=OPENAPI_TAGS,
        favicon_url="/favicon.ico",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.backend = backend
    app.state.metrics = metrics
    app.state.pool = pool
    app.state.workers = workers
    app.state.warmed_up = False
    app.state.render_queue = RenderQueue(
        workers,
        settings.max_queue,
        settings.max_concurrent_pixels,
        metrics,
        backend.name,
        large_render_pixels=settings.large_render_pixels,
    )
    app.state.event_streams = asyncio.Semaphore(settings.max_event_streams)  # GET /jobs/{id}/events
    shared_dir = settings.live_slots_dir or _own_live_slots_dir()  # the host's processes' shared state
    app.state.live_slots = LiveSlots(shared_dir, settings.max_live_sessions)
    app.state.live_origins = allowed_origins(settings.live_origins) | allowed_origins(settings.cors_origins)
    metrics.watch_live(app.state.live_slots)
    install_error_handlers(app)
    sketch.install(app)
    live.install(app)
    jobs_api.install(app, JOB_ROUTES)
    corpora.install(app)
    _add_service_routes(app)
    document_limits(app, settings)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    app.add_middleware(QuietStartupFailure)
    app.add_middleware(DocsPolicy)  # /docs and /redoc fetch nothing from another host
    app.add_middleware(BodyLimit, settings=settings)
    app.add_middleware(DeclaredLengthGuard, settings=settings, metrics=metrics)
    # keys (401), rate limits (429)
    app.add_middleware(AccessGuard, settings=settings, metrics=metrics, shared_dir=shared_dir)
    app.add_middleware(UploadGuard, settings=settings, metrics=metrics)  # 408s; early answers drained
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(AccessLogMiddleware, backend=backend.name)
    if settings.cors_origins.strip():  # outside the guards: preflights answered, their errors readable
        app.add_middleware(Cors, setting=settings.cors_origins)
    add_request_id_middleware(app)  # outermost: the 413s above and every log line get the id
    return app


def _own_live_slots_dir() -> Path:
    """A lone process's /live slots: a fresh temporary directory (removed at exit)."""
    directory = Path(tempfile.mkdtemp(prefix="pencil-gpu-live-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def _backend_and_pool(settings: Settings) -> tuple[Backend, DevicePool | None]:
    """The backend PENCIL_BACKEND asks for and, with CUDA, the pool of the PENCIL_DEVICES.
    'auto' falls back to the CPU when the pool cannot be built; 'cuda' fails loudly."""
    backend = select_backend(settings.backend)
    if backend.name != "cuda":
        return backend, None
    try:
        devices, sharing = home_devices(settings, len(backend.devices))
        memory_fraction = render_memory_fraction(settings.gpu_memory_fraction, sharing)
        pool = DevicePool(
            devices, settings.streams, memory_fraction, settings.batch_share, lease_timeout=settings.lease_timeout_s
        )
    except Exception as exc:  # no pool means no GPU backend, whatever the cause
        if settings.backend == "cuda":
            raise BackendUnavailable(f"PENCIL_BACKEND=cuda but the GPU pool could not be built: {exc}") from exc
        log.warning("CUDA found but the GPU pool could not be built (%s); using the CPU", exc)
        return Backend("cpu"), None
    chosen = set(pool.device_ids)
    return Backend("cuda", [d for d in backend.devices if int(d.split(":")[0]) in chosen]), pool


def render_memory_fraction(total: float, sharing: int) -> float:
    """Each process's share of a card that `sharing` processes render on: all of `total`
    alone; otherwise half of it split among them, the other half kept for the process that
    runs the batch jobs (JobRunner raises its cap to JOB_MEMORY_SHARE of `total`)."""
    return total if sharing <= 1 else total * (1 - JOB_MEMORY_SHARE) / sharing


def home_devices(settings: Settings, visible: int) -> tuple[list[int] | None, int]:
    """(the devices this process pools, how many processes share each of them). One of
    several server processes (`pencil-gpu serve` numbers them in PENCIL_PROCESS_INDEX)
    takes one device of PENCIL_DEVICES, round robin, so that each process holds one CUDA
    context and the devices get equal shares of the processes; alone, a process pools
    them all."""
    devices = parse_devices(settings.devices)
    if settings.process_index is None or settings.processes <= 1:
        return devices, max(1, settings.processes)
    candidates = devices if devices is not None else list(range(visible))
    if not candidates:
        return devices, settings.processes
    home = candidates[settings.process_index % len(candidates)]
    return [home], -(-settings.processes // len(candidates))


def _storage_problems(state: State) -> list[str]:
    """Why the data directory or the job database cannot be used now (none when they can):
    a small file created and removed, free space under PENCIL_MIN_FREE_BYTES, one small write
    transaction and a read of the job table (JobStore.probe), and any database error met within
    DATABASE_ERROR_NOT_READY_S."""
    data_dir = state.settings.data_dir
    if not data_dir.is_dir():
        return [f"data directory {data_dir} is missing"]
    problems = []
    problem = probe_directory(data_dir)
    if problem is not None:
        problems.append(f"data directory {data_dir} cannot be written: {problem}")
    minimum = state.settings.min_free_bytes
    if minimum:
        try:
            free = free_bytes(data_dir)
        except OSError as exc:
            problems.append(f"data directory {data_dir}: its free space cannot be read: {exc.strerror or exc}")
        else:
            if free < minimum:
                problems.append(
                    f"data directory {data_dir} has {free:,} bytes free, under PENCIL_MIN_FREE_BYTES ({minimum:,}): "
                    "submissions would fail with 507"
                )
    store = getattr(state, "jobs", None)
    if store is not None:
        try:
            store.probe()
        except DATABASE_ERRORS as exc:  # which is also the store's recent error now
            problems.append(f"job database cannot be written or read: {exc}")
        else:
            failure = store.recent_error(DATABASE_ERROR_NOT_READY_S)
            if failure is not None:
                problems.append(f"job database failed in the last {DATABASE_ERROR_NOT_READY_S:.0f} s: {failure}")
    return problems


def _add_service_routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/jobs-admin", include_in_schema=False)
    async def jobs_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "jobs.html", media_type="text/html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    @app.get("/healthz", summary="Liveness, backend and version", tags=["operations"])
    async def healthz(request: Request) -> dict:
        state = request.app.state
        return {
            "status": "ok",
            "backend": state.backend.name,
            "devices": state.backend.devices,
            "version": VERSION,
            "workers": state.workers,
            "processes": max(1, state.settings.processes),  # 0 (auto) resolves to 1 in a lone process
            "pid": os.getpid(),
            "runs_jobs": state.job_runner.leading if hasattr(state, "job_runner") else False,
            "replica": state.jobs.replica if hasattr(state, "jobs") else None,
            "job_database": state.jobs.database if hasattr(state, "jobs") else None,
            "gpus": state.pool.snapshot() if state.pool is not None else [],
            "limits": {
                "max_upload_bytes": state.settings.max_upload_bytes,
                "max_pixels": state.settings.max_pixels,
                "max_live_pixels": state.settings.max_live_pixels,
            },
            "live": {"sessions": state.live_slots.held(), "limit": state.live_slots.count},
            # the drawing options' defaults, which the page selects (gpu/pencil/params.py)
            "defaults": {option.name: option.default for option in PENCIL_OPTIONS if option.default is not None},
            "queue": {
                "waiting": state.render_queue.waiting,
                "running": state.render_queue.running,
                "limit": state.settings.max_queue,
            },
        }

    @app.get(
        "/readyz",
        summary="Readiness: can take a render now",
        tags=["operations"],
        responses={503: {"description": "not ready"}},
    )
    async def readyz(request: Request) -> JSONResponse:
        state = request.app.state
        problems = []
        if not state.warmed_up:
            problems.append("warming up (kernels, codecs, first renders)")
        if state.settings.admin_token:  # only batch jobs store anything
            problems += await asyncio.to_thread(_storage_problems, state)
        if state.render_queue.is_full():
            problems.append("render queue is full")
        if problems:
            return JSONResponse({"ready": False, "problems": problems}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"ready": True})

    @app.get("/metrics", summary="Prometheus metrics", tags=["operations"], response_class=Response)
    async def metrics(request: Request) -> Response:
        # a thread: the job counts are read from the database, which may be slow or down
        body = await asyncio.to_thread(generate_latest, request.app.state.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
