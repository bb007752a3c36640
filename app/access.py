"""Who may use the public routes, and how often: API keys and per-client rate limits for
/sketch and /live, and the token of /metrics, checked before any route runs.

- With API keys (PENCIL_API_KEYS, PENCIL_API_KEYS_FILE) a request to /sketch or /live
  presents one: `Authorization: Bearer <key>`, or for /live, where a browser cannot set
  headers, the query parameter `api_key` or the WebSocket subprotocol `pencil-key.<key>`
  (offered beside `pencil`, which the server selects). Without a known key: 401
  `unauthorized` (for /live, the handshake is answered 401). The key is taken out of the
  query string and the subprotocols before the route (or a log line) sees them.
- The client is the key's name with keys, else the address. With PENCIL_RATE_LIMIT each
  client has a token bucket (app/rate_limit.py); an empty one answers 429 `rate_limited`
  with Retry-After. /live counts one request a session; its frames are paced by the drawing.
- PENCIL_METRICS_TOKEN puts GET /metrics behind `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hmac
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api_keys import ApiKeys
from app.errors import error_response
from app.rate_limit import RateLimiter

if TYPE_CHECKING:
    from app.config import Settings
    from app.metrics import Metrics

GUARDED_PATHS = ("/sketch", "/live")
KEY_QUERY_PARAMETER = "api_key"
KEY_SUBPROTOCOL = "pencil-key."
LIVE_SUBPROTOCOL = "pencil"  # selected when offered, so a browser that sent a key subprotocol opens
CLIENT_STATE = "pencil_client"  # scope["state"] entry: the client a guarded request counts for


def client_of(scope: Scope) -> str:
    """The client a request counts for: `key:<name>` with API keys, else `address:<host>`
    (the one AccessGuard set, or the request's address where it set none)."""
    named = scope.get("state", {}).get(CLIENT_STATE)
    if named is not None:
        return named
    return f"address:{scope['client'][0] if scope.get('client') else 'unknown'}"


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            return credentials.strip() if scheme.lower() == "bearer" else None
    return None


def _live_key(scope: Scope) -> tuple[str | None, Scope]:
    """The key a /live handshake carries in its query string or subprotocols, and the scope
    without it."""
    pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    found = [value for name, value in pairs if name == KEY_QUERY_PARAMETER]
    protocols = list(scope.get("subprotocols", ()))
    found += [p[len(KEY_SUBPROTOCOL) :] for p in protocols if p.startswith(KEY_SUBPROTOCOL)]
    scope = {
        **scope,
        "query_string": urlencode([(n, v) for n, v in pairs if n != KEY_QUERY_PARAMETER]).encode("latin-1"),
        "subprotocols": [p for p in protocols if not p.startswith(KEY_SUBPROTOCOL)],
    }
    return (found[0] if found else None), scope


class AccessGuard:
    """The ASGI middleware of the module's docstring. Place it inside UploadGuard (so an
    early answer's body is drained) and MetricsMiddleware (so it is counted)."""

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics, shared_dir: Path) -> None:
        """`shared_dir`: where the host's server processes keep their shared state (the
        rate buckets, beside the /live slots)."""
        self.app, self.metrics = app, metrics
        self.keys = ApiKeys(settings.api_key_table)
        token = settings.metrics_token
        self.metrics_token = token.get_secret_value().encode() if token is not None else None
        self.limiter = (
            RateLimiter(settings.rate_limit, settings.rate_limit_burst, shared_dir) if settings.rate_limit > 0 else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or (kind == "http" and scope["method"] == "OPTIONS"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/metrics" and self.metrics_token is not None:
            given = (_bearer(scope) or "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, self.metrics_token):
                detail = "GET /metrics needs 'Authorization: Bearer <PENCIL_METRICS_TOKEN>'"
                await self._refuse(scope, receive, send, 401, "unauthorized", detail, {"WWW-Authenticate": "Bearer"})
                return
        elif path in GUARDED_PATHS:
            presented = _bearer(scope)
            if kind == "websocket":
                in_url, scope = _live_key(scope)
                presented = presented or in_url
            client = client_of(scope)
            if self.keys:
                name = self.keys.name_of(presented)
                if name is None:
                    detail = self._key_detail(kind, presented)
                    await self._refuse(
                        scope, receive, send, 401, "unauthorized", detail, {"WWW-Authenticate": "Bearer"}
                    )
                    return
                client = f"key:{name}"
            if self.limiter is not None and (wait := self.limiter.take(client)) > 0:
                detail = f"more than {self.limiter.rate:g} requests a second from this client; retry after the wait"
                retry = {"Retry-After": str(max(1, math.ceil(wait)))}
                await self._refuse(scope, receive, send, 429, "rate_limited", detail, retry)
                return
            scope.setdefault("state", {})[CLIENT_STATE] = client  # in place: routing's notes stay visible outside
        await self.app(scope, receive, send)

    @staticmethod
    def _key_detail(kind: str, presented: str | None) -> str:
        where = (
            "'Authorization: Bearer <key>', the query parameter api_key, or the subprotocol pencil-key.<key>"
            if kind == "websocket"
            else "'Authorization: Bearer <key>'"
        )
        return f"{'an unknown' if presented else 'no'} API key; this server needs one: send {where}"

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status: int,
        code: str,
        detail: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The error in our shape; for a WebSocket, as the handshake's HTTP answer where the
        server can send one (uvicorn can), else a plain refusal (403)."""
        self.metrics.rejected.labels(code).inc()
        if scope["type"] == "http":
            await error_response(status, code, detail, headers)(scope, receive, send)
            return
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": code, "detail": detail}).encode()
        raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        raw_headers += [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
        await send({"type": "websocket.http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "websocket.http.response.body", "body": body})
