"""Bounds on a request's head (request line and headers) for `pencil-gpu serve`: uvicorn's
httptools protocol, which sets none, with a size limit (431 past it, at once) and a time
limit (the connection is closed when a head takes longer), so that a client sending an
endless or endlessly slow header can hold neither memory nor a connection, nor slow the
event loop every other request shares.

The head's clock starts when the connection opens and again at the first byte of each later
request on it; between requests uvicorn's keep-alive timeout applies. Bodies are bounded
elsewhere (app/uploads.py).
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("pencil.http")


def bounded_protocol(max_head_bytes: int, head_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's `http` protocol class with these bounds (PENCIL_MAX_HEADER_BYTES,
    PENCIL_HEADER_TIMEOUT_S)."""

    class BoundedHead(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = None
            self._start_head()

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
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_head and not self.transport.is_closing():
                self._head_bytes += len(data)  # every byte of a chunk that ends inside the head is head
                if self._head_bytes > max_head_bytes:
                    self._refuse_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
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


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown client"
