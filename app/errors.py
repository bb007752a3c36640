"""The one error shape of the API: JSON `{"error": code, "detail": sentence}` with the
right status, for our own errors, Starlette's and validation errors alike. Nothing a
client sends reaches it as a stack trace.

Storage is answered, never a 500 (jobs/storage.py says why these statuses):
- StorageError (files under PENCIL_DATA_DIR, upload spooling): 507 insufficient_storage
  for a full disk or quota or a file-size limit (ENOSPC, EDQUOT, EFBIG), else 503
  storage_unavailable with Retry-After (EACCES, EROFS, EIO, ...);
- a job database error (sqlite3, or psycopg with PostgreSQL): 503 database_unavailable
  with Retry-After (a locked, unwritable, corrupt or unreachable database; a restart
  checks and repairs an SQLite one), or 507 insufficient_storage when the database reports
  a full disk (SQLITE_FULL, PostgreSQL's 53100 disk_full)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from asgi_correlation_id.context import correlation_id
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match

from gpu.codec.errors import ImageError
from gpu.errors import InputError, ParamError
from gpu.pool import DeviceOutOfMemory, PoolBusy
from gpu.spec import NotJson
from gpu.video.errors import VideoError
from jobs.storage import StorageError
from jobs.store import DATABASE_ERRORS

log = logging.getLogger("pencil.errors")


def too_large_detail(body_bytes: int | None, max_upload_bytes: int, variable: str = "PENCIL_MAX_UPLOAD_BYTES") -> str:
    """The one wording of a 413 for an oversize body, with or without its length;
    `variable` names the setting of the limit."""
    size = f"the request body is {body_bytes:,} bytes" if body_bytes is not None else "the request body is too large"
    return f"{size}; uploads are limited to {max_upload_bytes:,} bytes ({variable})"


# No example in the schema itself: each error response gets one example per code it may
# answer (ERROR_EXAMPLES, added to the document by app/openapi.py), so that no status shows
# another status's sample.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string", "description": "stable machine-readable code"},
        "detail": {"type": "string", "description": "what went wrong, for a person"},
        "field": {"type": "string", "description": "the parameter at fault, as the request spells it (some 422s)"},
    },
}

# code -> (status, an example detail as the server words it): the OpenAPI's example of each
# code. A response whose description names codes gets theirs; one naming none gets its
# status's first code here.
ERROR_EXAMPLES: dict[str, tuple[int, str]] = {
    "bad_request": (400, "the multipart form could not be parsed: missing boundary"),
    "missing_image": (400, "the form has no field named 'image' (fields sent: mode, tone)"),
    "empty_file": (400, "the file is empty"),
    "corrupt_image": (400, "the image is corrupt or truncated: broken data stream when reading image file"),
    "image_too_small": (400, "the image is 8x12 px; both sides must be at least 16 px"),
    "duplicate_field": (400, "the form has 2 fields named 'image'; send one image a request"),
    "cors_refused": (
        400,
        "Disallowed CORS origin: this server lets the pages of PENCIL_CORS_ORIGINS call it, with GET, POST, DELETE",
    ),
    "bad_idempotency_key": (400, "Idempotency-Key must be 1 to 200 characters"),
    "bad_page_token": (400, "page_token is not a next_page_token of this list"),
    "malformed_npy": (400, "the file 'a' is not a .npy array: bad magic string"),
    "unauthorized": (401, "no API key; this server needs one: send 'Authorization: Bearer <key>'"),
    "not_found": (404, "Not Found"),
    "job_not_found": (404, "no job 3f2a9c0e5b7d41e6a8c2f0d4b6e8a1c3"),
    "corpus_not_found": (404, "no corpus 9b1e4d7a2c5f48e3b0a6d9c2e5f8a1b4"),
    "file_not_found": (404, "the job has no result file 'u.npy'"),
    "method_not_allowed": (405, "Method Not Allowed"),
    "upload_timeout": (408, "no part of the request body came for 30 s (PENCIL_UPLOAD_TIMEOUT_S)"),
    "idempotency_conflict": (409, "this Idempotency-Key was sent before with another request"),
    "job_not_finished": (409, "the job is running: its result comes once it has succeeded"),
    "corpus_in_use": (409, "a queued or running search job uses this corpus"),
    "too_large": (413, too_large_detail(31_457_280, 26_214_400)),
    "too_many_pixels": (
        413,
        "the image is 10000x8000 px, 80,000,000 pixels; the limit is 50,000,000 (PENCIL_MAX_PIXELS)",
    ),
    "unsupported_media_type": (
        415,
        "send the photo as multipart/form-data with a field named 'image' (curl -F image=@photo.jpg), or as the "
        "raw body with an image/* Content-Type",
    ),
    "unsupported_format": (415, "only JPEG, PNG and WebP images are accepted"),
    "invalid_parameter": (422, "stroke_width must be between 0 and 5, got '9'"),
    "too_large_for_format": (
        422,
        "a WebP drawing is at most 16383 px a side, this one would be 20000: pick another format or max_side",
    ),
    "use_params_field": (422, "options go as JSON in the form field 'params', not as separate fields"),
    "rate_limited": (429, "more than 2 requests a second from this client; retry after the wait"),
    "headers_too_large": (431, "the request line and headers are over 65,536 bytes (PENCIL_MAX_HEADER_BYTES)"),
    "client_closed_request": (499, "the client closed the connection during its upload"),
    "internal_error": (500, "the server failed to handle this request; it has been logged"),
    "overloaded": (503, "16 renders are waiting, the limit (PENCIL_MAX_QUEUE); retry shortly"),
    "gpu_out_of_memory": (
        503,
        "the GPU ran out of memory for this render; retry shortly, or send a smaller image (or max_side)",
    ),
    "shutting_down": (503, "the server is shutting down; retry on another replica or in a moment"),
    "admin_disabled": (
        503,
        "batch jobs are disabled: set PENCIL_ADMIN_TOKEN (environment or .env) to a secret and restart",
    ),
    "storage_unavailable": (503, "could not write jobs/3f2a.../input: permission denied; retry later"),
    "database_unavailable": (503, "the job database cannot be used now (database is locked); retry later"),
    "insufficient_storage": (
        507,
        "could not write the upload: no space left on device; retry once an operator has freed space",
    ),
}


class ApiError(Exception):
    """An error answered to the client as it is."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def error_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error statuses, each with the one error body ERROR_SCHEMA.
    Routes that declare 422 here also replace FastAPI's default 422 (a pydantic error list
    this service never sends)."""
    return {
        status: {"description": text, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
        for status, text in descriptions.items()
    }


INVALID_PARAMETER = "invalid_parameter: a parameter out of range or of the wrong type (detail names it)"


def error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, field: str | None = None
) -> JSONResponse:
    """The one error body; `field` names the parameter at fault (a ParamError's 422)."""
    body = {"error": code, "detail": detail} if field is None else {"error": code, "detail": detail, "field": field}
    return JSONResponse(body, status_code=status, headers=headers)


# The HTTP status of each ImageError code (gpu/codec knows no HTTP).
IMAGE_ERROR_STATUS = {
    "empty_file": 400,
    "corrupt_image": 400,
    "image_too_small": 400,
    "too_many_pixels": 413,
    "unsupported_format": 415,
    "too_large_for_format": 422,
}

# The HTTP status of each VideoError code (gpu/video knows no HTTP).
VIDEO_ERROR_STATUS = {
    "empty_file": 400,
    "corrupt_video": 400,
    "video_too_small": 400,
    "too_many_pixels": 413,
    "not_a_video": 415,
    "unsupported_codec": 415,
    "no_video_stream": 422,
}

# The HTTP status of each InputError code (a job's input as a whole; gpu/ knows no HTTP).
INPUT_ERROR_STATUS = {
    "empty_file": 400,
    "malformed_npy": 400,
    "malformed_safetensors": 400,
    "unsupported_format": 415,
    "too_many_elements": 413,
    "grid_too_large": 413,
    "run_too_long": 413,
    "too_large_for_device": 413,
    "text_too_large": 413,
}

_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large", 415: "unsupported_format"}


def _rejected(
    request: Request,
    status: int,
    code: str,
    detail: str,
    headers: dict[str, str] | None = None,
    field: str | None = None,
) -> JSONResponse:
    """The error response, counted in the metrics as a rejected request by its code."""
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.rejected.labels(code).inc()
    return error_response(status, code, detail, headers, field)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return _rejected(request, exc.status, exc.code, exc.detail, exc.headers)


async def _param_error(request: Request, exc: ParamError) -> JSONResponse:
    """A parameter of a sketch or a job that its kind refuses: 422 naming the field."""
    return _rejected(request, 422, exc.code, str(exc), field=exc.field or None)


async def _image_error(request: Request, exc: ImageError) -> JSONResponse:
    return _rejected(request, IMAGE_ERROR_STATUS.get(exc.code, 400), exc.code, exc.detail)


async def _input_error(request: Request, exc: InputError) -> JSONResponse:
    return _rejected(request, INPUT_ERROR_STATUS.get(exc.code, 422), exc.code, exc.detail)


async def _video_error(request: Request, exc: VideoError) -> JSONResponse:
    return _rejected(request, VIDEO_ERROR_STATUS.get(exc.code, 400), exc.code, exc.detail)


async def _not_json(request: Request, exc: NotJson) -> JSONResponse:
    return _rejected(request, 400, "bad_request", str(exc))


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = _CODES.get(exc.status_code, HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_"))
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).description
    if exc.status_code == 413:  # from RequestBodyLimitMiddleware: a body without Content-Length
        settings, path = request.app.state.settings, request.url.path
        detail = too_large_detail(None, settings.upload_limit(path), settings.upload_limit_variable(path))
    headers = getattr(exc, "headers", None)
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
    return _rejected(request, exc.status_code, code, detail, headers)


def allowed_methods(request: Request) -> str:
    """Every method the app routes for the request's path, as an Allow header: Starlette's
    405 names only those of the first route whose path matches (POST /corpora hid GET)."""
    scope = {**request.scope, "method": "GET"}
    methods: set[str] = set()
    for route in _leaf_routes(request.app.router.routes):
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(scope)[0] != Match.NONE:
            methods |= set(route_methods)
    return ", ".join(sorted(methods))


def _leaf_routes(routes: list[BaseRoute]) -> list[BaseRoute]:
    """The routes of the app, those of included routers too (FastAPI keeps an included
    router as one entry whose `original_router` holds its routes, prefixes applied)."""
    leaves: list[BaseRoute] = []
    for route in routes:
        included = getattr(route, "original_router", None)
        leaves.extend(_leaf_routes(included.routes) if included is not None else [route])
    return leaves


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in ("body", "query"))
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return _rejected(request, 422, "invalid_parameter", "; ".join(parts) or "invalid request")


async def _client_disconnect(request: Request, exc: ClientDisconnect) -> JSONResponse:
    """The client left during its upload: nobody reads this answer, the metrics do."""
    return _rejected(request, 499, "client_closed_request", "the client closed the connection during its upload")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    # Starlette sends this answer outside the middlewares, the request id's included: add it here.
    request_id = correlation_id.get()
    headers = {"X-Request-ID": request_id} if request_id else None
    detail = "the server failed to handle this request; it has been logged"
    return error_response(500, "internal_error", detail, headers)


async def _pool_busy(request: Request, exc: PoolBusy) -> JSONResponse:
    return _rejected(request, 503, "overloaded", f"every GPU is busy ({exc}); retry shortly", {"Retry-After": "2"})


async def _out_of_memory(request: Request, exc: DeviceOutOfMemory) -> JSONResponse:
    log.warning("%s", exc)
    return _rejected(
        request,
        503,
        "gpu_out_of_memory",
        "the GPU ran out of memory for this render; retry shortly, or send a smaller image (or max_side)",
        {"Retry-After": "5"},
    )


STORAGE_RETRY_AFTER_S = "30"
SQLITE_FULL = 13


def _insufficient_storage(request: Request, reason: str) -> JSONResponse:
    return _rejected(
        request,
        507,
        "insufficient_storage",
        f"{reason}; the server's storage is full: retry once an operator has freed space",
    )


async def _storage_error(request: Request, exc: StorageError) -> JSONResponse:
    """507 when space is what it takes, else 503 with Retry-After; logged for the operator."""
    log.error("%s %s: %s", request.method, request.url.path, exc)
    if exc.out_of_space:
        return _insufficient_storage(request, str(exc))
    return _rejected(
        request,
        503,
        "storage_unavailable",
        f"{exc}; the server's storage cannot be used now, retry later",
        {"Retry-After": STORAGE_RETRY_AFTER_S},
    )


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """503 database_unavailable with Retry-After (507 for a full disk); logged for the operator."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    log.error("%s %s: job database error: %s", request.method, request.url.path, reason)
    full = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == SQLITE_FULL or getattr(exc, "sqlstate", None) == "53100"
    if full:
        return _insufficient_storage(request, f"could not write the job database: {reason}")
    return _rejected(
        request,
        503,
        "database_unavailable",
        f"the job database cannot be used now ({reason}); retry later",
        {"Retry-After": STORAGE_RETRY_AFTER_S},
    )


Handler = Callable[[Request, Any], Awaitable[Response]]
HANDLERS: dict[type[Exception], Handler] = {
    PoolBusy: _pool_busy,
    DeviceOutOfMemory: _out_of_memory,
    ApiError: _api_error,
    ImageError: _image_error,
    ParamError: _param_error,
    InputError: _input_error,
    NotJson: _not_json,
    VideoError: _video_error,
    StarletteHTTPException: _http_error,
    RequestValidationError: _validation_error,
    ClientDisconnect: _client_disconnect,
    StorageError: _storage_error,
    **dict.fromkeys(DATABASE_ERRORS, _database_error),
    Exception: _unexpected,
}


def install_error_handlers(app: FastAPI) -> None:
    for exception, handler in HANDLERS.items():
        app.add_exception_handler(exception, handler)
