"""Bounds on the connections of `pencil-gpu serve`: uvicorn's httptools protocol, which sets
none on a request's head and none on the number of connections, with

- a size limit on the head (request line and headers; 431 past it, at once) and a time
  limit (the connection is closed when a head takes longer), so that a client sending an
  endless or endlessly slow header can hold neither memory nor a connection, nor slow the
  event loop every other request shares. The head's clock starts when the connection opens
  and again at the first byte of each later request on it; between requests uvicorn's
  keep-alive timeout applies (PENCIL_KEEP_ALIVE_S). Bodies are bounded elsewhere
  (app/uploads.py).
- a cap on the connections a process holds (PENCIL_MAX_CONNECTIONS). A connection is idle
  while it has no request in flight: waiting for its first request, kept alive between two,
  or part-way through a head. When a new connection takes the process past the cap, the
  idle connection that has waited longest is closed (quietly: a client that had a request
  ready finds the connection closed and opens another, which HTTP clients do for a kept-alive
  connection the server closed). Only when every other connection has a request in flight
  (uploads, renders, /live sessions) does the newcomer's request get 503 `overloaded` with
  `Retry-After` and `Connection: close` instead of being served, except the probes
  (/healthz, /readyz, /metrics), which are always answered. So idle or trickling
  connections can never crowd out a request, and a probe is answered whatever the load.

uvicorn's own `limit_concurrency` is not used: it answers 503 (plain text) to every request,
probes included, once connections or tasks reach it, so idle connections alone could turn
the server away and a liveness probe would fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("pencil.http")

PROBES = frozenset({b"/healthz", b"/readyz", b"/metrics"})  # answered over the connection cap too
LOG_EVERY_S = 10.0  # closed idle connections and refused requests are logged at most this often, counted


def bounded_protocol(
    max_head_bytes: int, head_timeout_s: float, max_connections: int | None = None
) -> type[HttpToolsProtocol]:
    """uvicorn's `http` protocol class with these bounds (PENCIL_MAX_HEADER_BYTES,
    PENCIL_HEADER_TIMEOUT_S, PENCIL_MAX_CONNECTIONS; None: no cap)."""
    # The process's idle connections, longest waiting first (one event loop: no lock needed).
    idle: OrderedDict[HttpToolsProtocol, None] = OrderedDict()
    tally = _Tally()
    refusal = _refusal(max_connections or 0)

    class BoundedHead(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = None
            self._start_head()
            if max_connections is not None:
                idle[self] = None
                if len(self.connections) > max_connections:
                    self._close_longest_idle()

        def _close_longest_idle(self) -> bool:
            """Close the connection that has been idle longest (not this one) to make room;
            False when every other connection has a request in flight."""
            for victim in idle:
                if victim is not self:
                    break
            else:
                return False
            del idle[victim]
            self.connections.discard(victim)  # counted out now: its close completes on a later turn
            victim.transport.close()
            tally.closed += 1
            tally.report(max_connections)
            return True

        def _start_head(self) -> None:
            self._in_head, self._head_bytes = True, 0
            self._stop_head_timer()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_too_slow)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._in_head:  # the next request on a kept-alive connection
                self._start_head()

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._stop_head_timer()
            if max_connections is not None:
                idle.pop(self, None)  # a request in flight
                if (
                    len(self.connections) > max_connections
                    and not self._close_longest_idle()
                    and self.url.partition(b"?")[0] not in PROBES
                ):
                    self.app = refusal  # this request only: the cycle takes the app now
                    super().on_headers_complete()
                    self.app = self.config.loaded_app
                    tally.refused += 1
                    tally.report(max_connections)
                    return
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            waiting = bool(self.pipeline)  # a pipelined request starts now: still in flight
            super().on_response_complete()
            if max_connections is not None and not waiting and not self.transport.is_closing():
                idle[self] = None  # kept alive: idle again, the newest

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_head and not self.transport.is_closing():
                self._head_bytes += len(data)  # every byte of a chunk that ends inside the head is head
                if self._head_bytes > max_head_bytes:
                    self._refuse_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            idle.pop(self, None)
            super().connection_lost(exc)

        def _refuse_head(self) -> None:
            log.warning(
                "refused a request from %s whose line and headers pass %d bytes (431)",
                _address(self.client),
                max_head_bytes,
            )
            detail = f"the request line and headers are larger than {max_head_bytes} bytes (PENCIL_MAX_HEADER_BYTES)"
            body = json.dumps({"error": "headers_too_large", "detail": detail}).encode()
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n"
                b"connection: close\r\n\r\n" + body
            )
            self._in_head = False
            self._stop_head_timer()
            self.transport.close()

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self._in_head and not self.transport.is_closing():
                if self._head_bytes:  # an idle connection that never sent a byte is closed quietly
                    log.warning(
                        "closed a connection from %s: its request line and headers took over %g s",
                        _address(self.client),
                        head_timeout_s,
                    )
                self.transport.close()

    return BoundedHead


class _Tally:
    """Connections closed to stay under the cap and requests refused over it, logged at most
    every LOG_EVERY_S with their counts (a flood of connections logs a line, not a line each)."""

    def __init__(self) -> None:
        self.closed = self.refused = 0
        self._logged = -LOG_EVERY_S

    def report(self, cap: int | None) -> None:
        now = time.monotonic()
        if now - self._logged < LOG_EVERY_S:
            return
        self._logged = now
        log.warning(
            "at the connection cap (PENCIL_MAX_CONNECTIONS=%s): closed %d idle connection(s) and answered %d "
            "request(s) 503 since the last such line",
            cap,
            self.closed,
            self.refused,
        )
        self.closed = self.refused = 0


def _refusal(cap: int) -> Any:
    """The ASGI app answering a request over the connection cap: 503 overloaded."""
    detail = (
        f"the server process holds {cap} connections (PENCIL_MAX_CONNECTIONS), each with a request in flight; "
        "try again shortly"
    )
    body = json.dumps({"error": "overloaded", "detail": detail}).encode()

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown client"
