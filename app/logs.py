"""Logging of the service: one setup for every process, request ids, one access line per request.

`configure_logging` sends the records of all loggers (ours, uvicorn's, libraries') to one
stderr handler, as JSON lines (python-json-logger) or as text for a terminal
(PENCIL_LOG_FORMAT). Every record carries `request_id`: the X-Request-ID of the request
being handled (asgi-correlation-id keeps it in a context variable), the id of the request
that submitted the job a runner thread works on (`request_context`), or null.
`AccessLogMiddleware` writes one line per HTTP request on the logger `pencil.access`;
uvicorn's own access log is turned off.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING

from asgi_correlation_id import CorrelationIdMiddleware
from asgi_correlation_id.context import correlation_id
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.metrics import route_label

if TYPE_CHECKING:
    from fastapi import FastAPI

REQUEST_ID_HEADER = "X-Request-ID"
# A client's id is kept when it is 1 to 128 of these characters (UUIDs, hex, base64, trace ids);
# anything else is replaced by a fresh uuid4 hex.
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+/=-]{1,128}")
_API_KEY_IN_QUERY = re.compile(r"([?&]api_key=)[^&\s\"']*")
_HANDLER_NAME = "pencil"  # marks the handler configure_logging installed, so a second call replaces it
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
_STANDARD_ATTRS = frozenset(RESERVED_ATTRS) | {"taskName", "request_id", "color_message"}

access_log = logging.getLogger("pencil.access")


def valid_request_id(value: str) -> bool:
    """Whether a client's X-Request-ID may be used as it is."""
    return _VALID_REQUEST_ID.fullmatch(value) is not None


def current_request_id() -> str | None:
    """The id of the request (or job) this code runs for, or None."""
    return correlation_id.get()


@contextmanager
def request_context(request_id: str | None) -> Iterator[None]:
    """Log with `request_id` inside the block (a job run for the request that submitted it)."""
    token = correlation_id.set(request_id)
    try:
        yield
    finally:
        correlation_id.reset(token)


class RequestIdFilter(logging.Filter):
    """Sets `record.request_id` from the context, unless the call gave one (extra=...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = correlation_id.get()
        return True


class RedactKeysFilter(logging.Filter):
    """Blanks the value of an `api_key` query parameter in a record's message: uvicorn logs
    each WebSocket handshake's path with its query string, where /live may carry an API key
    (app/access.py). Keys reach no other log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "api_key=" in message:
            record.msg, record.args = _API_KEY_IN_QUERY.sub(r"\1[redacted]", message), None
        return True


class TextFormatter(logging.Formatter):
    """One line for a person: time, level, logger, [request id], message, then the
    structured fields of the record (extra=...) as key=value."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        saved = getattr(record, "request_id", None)
        record.request_id = saved or "-"
        try:
            line = super().format(record)
        finally:
            record.request_id = saved
        fields = [f"{key}={value}" for key, value in record.__dict__.items() if key not in _STANDARD_ATTRS]
        if not fields:
            return line
        head, _, trace = line.partition("\n")  # keep a traceback below the fields
        return f"{head} {' '.join(fields)}" + (f"\n{trace}" if trace else "")


class _JsonFormatter(JsonFormatter):
    def process_log_record(self, log_data: dict) -> dict:
        """The timestamp first, for a person reading the lines."""
        return {"timestamp": log_data.pop("timestamp", None), **log_data}


def json_formatter() -> JsonFormatter:
    """timestamp (ISO 8601, UTC), level, logger, message, request_id, pid (several server
    processes share the stream), then the record's extras."""
    return _JsonFormatter(
        "%(levelname)s %(name)s %(message)s %(request_id)s %(process)d",
        rename_fields={"levelname": "level", "name": "logger", "process": "pid"},
        timestamp=True,
        reserved_attrs=[*RESERVED_ATTRS, "taskName", "color_message"],  # color_message: uvicorn's
    )


def resolve_format(log_format: str, stream: IO[str]) -> str:
    """'auto' is text on a terminal, JSON otherwise (a file, a pipe, a log collector)."""
    if log_format != "auto":
        return log_format
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def configure_logging(level: str = "info", log_format: str = "auto", stream: IO[str] | None = None) -> None:
    """Send every logger's records to one handler on the root logger (idempotent: a second
    call replaces the handler of the first). uvicorn's loggers lose their own handlers and
    propagate to it, but for uvicorn.access, which AccessLogMiddleware replaces."""
    stream = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(stream)
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(RequestIdFilter())
    handler.addFilter(RedactKeysFilter())
    handler.setFormatter(TextFormatter() if resolve_format(log_format, stream) == "text" else json_formatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.asgi"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    uvicorn_access = logging.getLogger("uvicorn.access")
    uvicorn_access.handlers.clear()
    uvicorn_access.propagate = False


def add_request_id_middleware(app: FastAPI) -> None:
    """X-Request-ID on every request and response (asgi-correlation-id): the client's when
    `valid_request_id`, else a new uuid4 hex. Add it last, so that it is the outermost."""
    app.add_middleware(CorrelationIdMiddleware, header_name=REQUEST_ID_HEADER, validator=valid_request_id)


def _header_number(headers: dict[bytes, bytes], name: bytes) -> float | None:
    try:
        return float(headers[name])
    except (KeyError, ValueError):
        return None


class AccessLogMiddleware:
    """One `pencil.access` line per HTTP request: method, path, route template, status,
    duration_ms, bytes (response body), request_bytes (body read), client, backend, and for
    a render render_ms and queue_ms (from the X-Render-Ms and X-Queue-Ms headers sketch.py
    sets). Place it inside CorrelationIdMiddleware, so the line carries the request id."""

    def __init__(self, app: ASGIApp, backend: str):
        self.app, self.backend = app, backend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_scope = dict(scope)
        status, sent, received = 500, 0, 0  # 500: an exception ends the request before a response starts
        headers: dict[bytes, bytes] = {}

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def recording_send(message: Message) -> None:
            nonlocal status, sent, headers
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = {key.lower(): value for key, value in message.get("headers", ())}
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counting_receive, recording_send)
        finally:
            self._log(scope, request_scope, status, sent, received, headers, start)

    def _log(
        self,
        scope: Scope,
        request_scope: Scope,
        status: int,
        sent: int,
        received: int,
        headers: dict[bytes, bytes],
        start: float,
    ) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        fields = {
            "method": scope["method"],
            "path": request_scope.get("path", ""),
            "route": route_label(scope, request_scope),
            "status": status,
            "duration_ms": round((time.perf_counter() - start) * 1000, 2),
            "bytes": sent,
            "request_bytes": received,
            "client": scope["client"][0] if scope.get("client") else None,
            "backend": headers.get(b"x-backend", b"").decode("latin-1") or self.backend,
        }
        for key, header in (("render_ms", b"x-render-ms"), ("queue_ms", b"x-queue-ms")):
            value = _header_number(headers, header)
            if value is not None:
                fields[key] = value
        access_log.info("%s %s %d", fields["method"], fields["path"], status, extra=fields)
