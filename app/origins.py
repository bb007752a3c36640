"""Which web pages may use the API from a browser: a page's origin (scheme://host[:port], as
its browser sends it in the Origin header) against the server's own and an allow-list; and
the CORS answers that let the pages of PENCIL_CORS_ORIGINS call the API."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from app.errors import error_response

DEFAULT_PORTS = {"http": 80, "https": 443}
CORS_METHODS = ("GET", "POST", "DELETE")
# What a page may send: keys and tokens, its request id, a JSON body, an idempotency key.
CORS_REQUEST_HEADERS = ("Authorization", "Content-Type", "X-Request-ID", "Idempotency-Key")
# What a page may read of an answer besides the CORS-safelisted headers.
CORS_RESPONSE_HEADERS = (
    "X-Backend",
    "X-Render-Ms",
    "X-Queue-Ms",
    "X-Image-Size",
    "X-Codecs",
    "X-Request-ID",
    "Content-Disposition",
    "Retry-After",
    "Location",
    "WWW-Authenticate",
)
CORS_MAX_AGE_S = 600  # how long a browser may keep a preflight's answer


def allowed_origins(setting: str) -> frozenset[str]:
    """The allow-list of a setting such as PENCIL_LIVE_ORIGINS: '*', or comma-separated
    origins, kept in the form browsers send (lower case, no trailing slash)."""
    return frozenset(part.strip().lower().rstrip("/") for part in setting.split(",") if part.strip())


def same_origin(origin: str, host: str) -> bool:
    """Whether a page at `origin` is served by this server, reached as `host` (the Host
    header: host[:port], the port the origin's scheme implies when none is given)."""
    try:
        page = urlsplit(origin)
        server = urlsplit(f"//{host}")
        page_port = page.port or DEFAULT_PORTS.get(page.scheme)
        server_port = server.port or DEFAULT_PORTS.get(page.scheme)
    except ValueError:  # a port that is not a number
        return False
    return (
        page.scheme in DEFAULT_PORTS
        and page.hostname is not None
        and page.hostname == server.hostname
        and page_port == server_port
    )


def origin_allowed(origin: str | None, host: str | None, allowed: frozenset[str]) -> bool:
    """A request from `origin` (None: no Origin header, so not sent by a browser page) may go
    on: no origin, any origin with '*', one on the list, or the server's own."""
    if origin is None or "*" in allowed:
        return True
    origin = origin.strip().lower()
    return origin in allowed or (host is not None and same_origin(origin, host.strip().lower()))


class Cors(CORSMiddleware):
    """Starlette's CORS middleware for the origins of PENCIL_CORS_ORIGINS, whose refused
    preflights answer in the API's error shape (400 `cors_refused`) rather than plain text.
    No credentials (cookies) are allowed: keys travel in the Authorization header."""

    def __init__(self, app: ASGIApp, setting: str) -> None:
        origins = allowed_origins(setting)
        super().__init__(
            app,
            allow_origins=["*"] if "*" in origins else sorted(origins),
            allow_methods=CORS_METHODS,
            allow_headers=CORS_REQUEST_HEADERS,
            expose_headers=CORS_RESPONSE_HEADERS,
            max_age=CORS_MAX_AGE_S,
        )

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        reason = bytes(response.body).decode("utf-8", "replace")  # "Disallowed CORS origin, method"...
        detail = f"{reason}: this server lets the pages of PENCIL_CORS_ORIGINS call it, with {', '.join(CORS_METHODS)}"
        return error_response(400, "cors_refused", detail, headers={"Vary": "Origin"})
