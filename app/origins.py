"""Which web pages may use the API from a browser: a page's origin (scheme://host[:port], as
its browser sends it in the Origin header) against the server's own and an allow-list."""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


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
