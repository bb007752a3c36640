"""Request bodies on the wire: how long an upload may take, and what becomes of a body
that is answered before it has been read. One pure ASGI middleware, `UploadGuard`, wraps
`receive` and `send` of every HTTP request with a body (/sketch, /jobs/*, /corpora alike).

Upload timeout. While the body is incomplete, each wait for its next piece lasts at most
PENCIL_UPLOAD_TIMEOUT_S, and the waits together at most PENCIL_UPLOAD_TIMEOUT_S plus one
second for every PENCIL_UPLOAD_MIN_BYTES_PER_S bytes received (Apache mod_reqtimeout's
MinRate): a client that stalls, or trickles a byte at a time, gets 408 `upload_timeout`
with `Connection: close`, while a slow but steady upload passes however long it takes.
Only the time spent waiting for the client counts, not the time a route spends on what
it has received. Once the body is complete, `receive` is passed through untouched (a
render watches it for the client leaving, as long as the render lasts).

Early answers. A route may answer before it reads the body: 503 when the render queue is
full, 413 from the declared length, 401, 415, 404... uvicorn cannot hand the body to the
app once the answer is complete. On a kept-alive connection it then reads and drops the
whole body itself, however large; on a connection it closes (`Connection: close` or an
HTTP/1.0 client) the kernel resets it while the client is still sending, and a client
that writes its whole body before reading (Python's urllib, many scripts) gets the reset
instead of the answer. So the guard sends the answer but keeps the response open while it
reads and drops up to PENCIL_REFUSED_DRAIN_BYTES more of the body, for at most
PENCIL_REFUSED_DRAIN_S, then ends it. A body whose rest is declared no larger than that
keeps its connection; a larger one, or one of unknown length (chunked), is answered with
`Connection: close`, so a refused request costs about that many bytes and no more. A
client that sent `Expect: 100-continue` and whose body was never asked for gets the
answer at once, with `Connection: close` and no `100 Continue` (uvicorn sends that on the
first `receive`): it sends no body at all.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.config import Settings
from app.errors import error_response
from app.metrics import Metrics

log = logging.getLogger("pencil.uploads")


class UploadTimedOut(Exception):
    """Raised by the guarded `receive` when the body comes too slowly; the guard answers 408."""


class _Body:
    """One request's body as the guard sees it: what is still to come, and the clock."""

    def __init__(self, scope: Scope, receive: Receive, settings: Settings) -> None:
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        self.length = int(length) if length.isdigit() else None
        self.pending = b"transfer-encoding" in headers or bool(self.length)  # body bytes still to come
        self.expects_continue = headers.get(b"expect", b"").lower() == b"100-continue"
        self.asked = False  # receive() was called: uvicorn has sent 100 Continue where it was expected
        self.received = 0  # body bytes received
        self.waited = 0.0  # seconds spent waiting for them
        self.timed_out: str | None = None  # why, once the upload has timed out
        self._receive = receive
        self._idle_s = settings.upload_timeout_s
        self._min_rate = settings.upload_min_bytes_per_s

    async def receive(self) -> Message:
        """The next message, within the upload's time limits (UploadTimedOut past them)."""
        if not self.pending:
            return await self._receive()
        if self.timed_out:
            raise UploadTimedOut(self.timed_out)
        self.asked = True
        budget, by_rate = self._idle_s, False
        if self._min_rate > 0 and self._idle_s + self.received / self._min_rate - self.waited < budget:
            budget, by_rate = self._idle_s + self.received / self._min_rate - self.waited, True
        start = time.monotonic()
        try:
            async with asyncio.timeout(max(budget, 0.0)):
                message = await self._receive()
        except TimeoutError:
            self.waited += time.monotonic() - start
            self.timed_out = self._why(by_rate)
            raise UploadTimedOut(self.timed_out) from None
        self.waited += time.monotonic() - start
        self._account(message)
        return message

    def _why(self, by_rate: bool) -> str:
        if by_rate:
            return (
                f"the request body came too slowly: {self.received:,} bytes in {self.waited:.0f} s, under "
                f"{self._min_rate:g} bytes a second (PENCIL_UPLOAD_MIN_BYTES_PER_S); the connection is closed"
            )
        return (
            f"the request body stopped coming: nothing for {self._idle_s:g} s (PENCIL_UPLOAD_TIMEOUT_S) after "
            f"{self.received:,} bytes; the connection is closed"
        )

    def _account(self, message: Message) -> None:
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.pending = message.get("more_body", False)
        else:  # http.disconnect: nothing more will come
            self.pending = False

    async def drain(self, limit: int, seconds: float) -> int:
        """Read and drop the rest of the body, up to `limit` bytes and for at most `seconds`;
        the bytes dropped."""
        dropped = 0
        try:
            async with asyncio.timeout(seconds):
                while self.pending and dropped < limit:
                    message = await self._receive()
                    dropped += len(message.get("body", b""))
                    self._account(message)
        except TimeoutError:
            pass
        return dropped


def _with_close(message: Message) -> Message:
    """The response start `message` with `Connection: close` (unless it says so already)."""
    headers = list(message.get("headers", []))
    if not any(name.lower() == b"connection" and b"close" in value.lower() for name, value in headers):
        headers.append((b"connection", b"close"))
    return {**message, "headers": headers}


class UploadGuard:
    """Upload timeouts (408) and early answers read by the client rather than reset;
    see the module's docstring."""

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _Body(scope, receive, self.settings)
        if not body.pending:  # no body: nothing to guard
            await self.app(scope, receive, send)
            return
        started = linger = False

        async def guarded_send(message: Message) -> None:
            nonlocal started, linger
            if body.timed_out:
                return  # whatever the route makes of it, the answer is the guard's 408
            if message["type"] == "http.response.start":
                started = True
                if body.pending:  # an answer before the body was read
                    message, linger = self._early_start(body, message)
            elif linger and message["type"] == "http.response.body" and not message.get("more_body", False):
                await send({**message, "more_body": True})  # the whole answer is out: the client can read it
                await body.drain(self.settings.refused_drain_bytes, self.settings.refused_drain_s)
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        try:
            await self.app(scope, body.receive, guarded_send)
        except Exception:
            if not body.timed_out:
                raise
            log.debug("upload timed out on %s %s", scope.get("method"), scope.get("path"), exc_info=True)
        if body.timed_out and not started:
            self.metrics.rejected.labels("upload_timeout").inc()
            response = error_response(408, "upload_timeout", body.timed_out, {"Connection": "close"})
            await response(scope, receive, send)

    def _early_start(self, body: _Body, message: Message) -> tuple[Message, bool]:
        """(the response start, whether to drain the body after the answer) of an answer
        sent before the body was read."""
        if body.expects_continue and not body.asked:
            return _with_close(message), False  # no 100 Continue was sent: the client sends no body
        rest = None if body.length is None else body.length - body.received
        keep_alive = rest is not None and rest <= self.settings.refused_drain_bytes
        return (message if keep_alive else _with_close(message)), True
