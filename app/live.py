"""/live: a WebSocket that draws a stream of frames as they come (protocol: docs/live.md).

A connection runs two tasks: the reader takes every message off the socket (a frame goes
into a one-frame slot, replacing, and so dropping, one still waiting there; an options
message changes the options for the frames after it), and the drawer takes the slot's
frame, draws it through the render queue like a /sketch upload, and sends the timing and
the drawing. So a client that sends faster than the server draws gets the freshest frame
each time, never a backlog, and a frame holds a GPU lease only while it is drawn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from app.access import LIVE_SUBPROTOCOL, client_of
from app.errors import ApiError
from app.live_slots import LiveSlots
from app.origins import origin_allowed
from app.render_queue import Timed
from app.sketch import parse_options
from gpu import pencil
from gpu.codec.decode import open_image
from gpu.codec.encode import check_encodable
from gpu.codec.errors import ImageError
from gpu.pencil.params import PENCIL_OPTIONS, PencilParams, fitted_size
from gpu.pool import DeviceOutOfMemory, PoolBusy

log = logging.getLogger("pencil.live")

LIVE_FORMATS = ("jpeg", "webp")  # PNG is too slow to encode for a stream
LIVE_DEFAULT_QUALITY = 80
CLOSE_TOO_MANY_SESSIONS = 1013  # "try again later" (RFC 6455 registry)
CLOSE_BAD_OPTIONS = 4422
CLOSE_GOING_AWAY = 1001
CLOSE_TOO_BIG = 1009


@dataclass
class Options:
    """A session's drawing and encode options, and the raw values they came from (so a
    later options message changes only what it names)."""

    raw: dict[str, str]
    params: PencilParams
    fmt: str
    quality: int

    @classmethod
    def parse(cls, raw: dict[str, str]) -> Options:
        """Raises ApiError 422 naming the offending option."""
        raw = {"format": "jpeg", "quality": str(LIVE_DEFAULT_QUALITY), **raw}
        params, fmt, quality = parse_options({}, raw)
        if fmt not in LIVE_FORMATS:
            raise ApiError(422, "invalid_parameter", f"format must be one of {', '.join(LIVE_FORMATS)} for /live")
        return cls(raw, params, fmt, quality)

    def resolved(self) -> dict[str, Any]:
        described = {option.name: getattr(self.params, option.name, None) for option in PENCIL_OPTIONS}
        return {**{k: v for k, v in described.items() if v is not None}, "format": self.fmt, "quality": self.quality}


@dataclass
class Frame:
    number: int  # 1 for the connection's first binary message
    data: bytes
    arrived: float  # time.perf_counter()
    options: Options


@dataclass
class Session:
    """The state the reader and the drawer share: the waiting frame and the counters."""

    options: Options
    received: int = 0
    dropped: int = 0
    waiting: Frame | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    def offer(self, frame: Frame) -> None:
        if self.waiting is not None:
            self.dropped += 1
        self.waiting = frame
        self.ready.set()

    async def take(self) -> Frame | None:
        while self.waiting is None and not self.closed:
            self.ready.clear()
            await self.ready.wait()
        frame, self.waiting = self.waiting, None
        return frame


def _text_options(message: str) -> dict[str, str]:
    """The options of a text message {"type": "options", "options": {...}}, as strings.
    Raises ApiError 400 bad_message."""
    try:
        body = json.loads(message)
    except ValueError:
        raise ApiError(400, "bad_message", 'text messages must be JSON: {"type": "options", ...}') from None
    if not isinstance(body, dict) or body.get("type") != "options" or not isinstance(body.get("options"), dict):
        raise ApiError(400, "bad_message", 'the only text message is {"type": "options", "options": {...}}')
    options = body["options"]
    if not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in options.values()):
        raise ApiError(400, "bad_message", "option values must be strings or numbers")
    return {str(k): str(v) for k, v in options.items()}


class LiveConnection:
    """One accepted /live connection (the route below opens it)."""

    def __init__(self, websocket: WebSocket, session: Session) -> None:
        self.websocket, self.session = websocket, session
        state = websocket.app.state
        self.settings, self.backend, self.queue = state.settings, state.backend, state.render_queue
        self.pool, self.metrics = state.pool, state.metrics
        self.send_lock = asyncio.Lock()  # a frame's two messages go out together

    async def send_json(self, body: dict[str, Any]) -> None:
        async with self.send_lock:
            await self.websocket.send_text(json.dumps(body))

    async def read(self) -> None:
        """Until the client closes: frames into the session's slot, options applied."""
        session = self.session
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                if len(message["bytes"]) > self.settings.max_upload_bytes:  # uvicorn's own limit may be higher
                    size, limit = len(message["bytes"]), self.settings.max_upload_bytes
                    await self.websocket.close(CLOSE_TOO_BIG, f"a frame of {size:,} bytes; the limit is {limit:,}")
                    return
                session.received += 1
                session.offer(Frame(session.received, message["bytes"], time.perf_counter(), session.options))
                continue
            try:
                changed = Options.parse({**session.options.raw, **_text_options(message.get("text") or "")})
            except ApiError as exc:
                self.metrics.live_frames.labels("error").inc()
                await self.send_json({"type": "error", "error": exc.code, "detail": exc.detail})
                continue
            session.options = changed
            await self.send_json({"type": "options", "options": changed.resolved()})

    async def draw(self) -> None:
        """Until the session closes: the waiting frame drawn and sent."""
        session = self.session
        while (frame := await session.take()) is not None:
            try:
                drawing, timed = await self._render(frame)
            except ApiError as exc:
                if exc.code in ("overloaded", "gpu_out_of_memory"):
                    session.dropped += 1  # the server was full: the next frame may fit
                self.metrics.live_frames.labels("error").inc()
                await self.send_json({"type": "error", "error": exc.code, "detail": exc.detail, "frame": frame.number})
                continue
            latency_ms = (time.perf_counter() - frame.arrived) * 1000
            header: dict[str, Any] = {
                "type": "frame",
                "frame": frame.number,
                "dropped": session.dropped,
                "width": drawing.width,
                "height": drawing.height,
                "queue_ms": round(timed.queue_ms, 2),
                "render_ms": round(timed.run_ms, 2),
                "latency_ms": round(latency_ms, 2),
                "codecs": f"decode {drawing.decoded_on}, encode {drawing.encoded_on}",
            }
            async with self.send_lock:
                await self.websocket.send_text(json.dumps(header))
                await self.websocket.send_bytes(drawing.data)
            self.metrics.live_frames.labels("drawn").inc()
            self.metrics.live_latency.observe(latency_ms / 1000)

    async def _render(self, frame: Frame) -> tuple[pencil.Drawing, Timed[pencil.Drawing]]:
        """(Drawing, Timed) of one frame; ApiError for whatever the client should hear."""
        options = frame.options
        try:
            photo = open_image(frame.data, self.settings.max_live_pixels)
            height, width = fitted_size(photo.height, photo.width, options.params.max_side)
            check_encodable(width, height, options.fmt)

            def job() -> pencil.Drawing:
                return pencil.draw_bytes(
                    frame.data, photo, options.params, options.fmt, options.quality, self.backend.name, pool=self.pool
                )

            timed = await self.queue.run(job, pixels=width * height)
        except ImageError as exc:
            raise ApiError(422 if exc.code == "too_large_for_format" else 400, exc.code, exc.detail) from None
        except PoolBusy as exc:
            raise ApiError(503, "overloaded", f"every GPU is busy ({exc})") from None
        except DeviceOutOfMemory:
            raise ApiError(503, "gpu_out_of_memory", "the GPU ran out of memory for this frame") from None
        return timed.value, timed


async def live(websocket: WebSocket) -> None:
    state = websocket.app.state
    slots: LiveSlots = state.live_slots
    origin = websocket.headers.get("origin")
    if not origin_allowed(origin, websocket.headers.get("host"), state.live_origins):
        log.warning(
            "refused a /live session from the web page at %s (not in PENCIL_LIVE_ORIGINS or PENCIL_CORS_ORIGINS)",
            (origin or "")[:200],
        )
        state.metrics.rejected.labels("origin_not_allowed").inc()
        await websocket.close()  # before accepting: the handshake is answered 403
        return
    # A browser that offered subprotocols (an API key as pencil-key.<key>, app/access.py) opens
    # only when one is selected.
    offered = websocket.scope.get("subprotocols", ())
    await websocket.accept(subprotocol=LIVE_SUBPROTOCOL if LIVE_SUBPROTOCOL in offered else None)
    try:
        options = Options.parse(dict(websocket.query_params))
    except ApiError as exc:
        await websocket.send_text(json.dumps({"type": "error", "error": exc.code, "detail": exc.detail}))
        await websocket.close(CLOSE_BAD_OPTIONS, exc.detail[:120])  # a close reason holds at most 123 bytes
        return
    share_limit = state.settings.live_sessions_per_client
    share = slots.acquire_share(client_of(websocket.scope), share_limit) if share_limit else None
    if share_limit and share is None:
        state.metrics.rejected.labels("live_share_used").inc()
        reason = f"this client has {share_limit} live sessions open, its share; retry later"
        await websocket.close(CLOSE_TOO_MANY_SESSIONS, reason)
        return
    slot = slots.acquire()
    if slot is None:
        if share is not None:
            slots.release(share)
        state.metrics.rejected.labels("too_many_live_sessions").inc()
        await websocket.close(CLOSE_TOO_MANY_SESSIONS, f"{slots.count} live sessions are open, the limit; retry later")
        return
    session = Session(options)
    connection = LiveConnection(websocket, session)
    tasks: list[asyncio.Future] = []
    try:
        await connection.send_json(
            {
                "type": "ready",
                "options": options.resolved(),
                "backend": state.backend.name,
                "max_pixels": state.settings.max_live_pixels,
                "max_bytes": state.settings.max_upload_bytes,
            }
        )
        tasks = [asyncio.ensure_future(connection.read()), asyncio.ensure_future(connection.draw())]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a failure of either task ends the session (logged below)
    except WebSocketDisconnect:
        pass
    except Exception:
        log.exception("live session failed")
    finally:
        session.closed = True
        session.ready.set()
        for task in tasks:
            task.cancel()
        slots.release(slot)
        if share is not None:
            slots.release(share)
        log.info("live session closed: %d frames received, %d dropped", session.received, session.dropped)
        if websocket.client_state == WebSocketState.CONNECTED:
            await _close_quietly(websocket, CLOSE_GOING_AWAY if state.render_queue.closed else 1000)


async def _close_quietly(websocket: WebSocket, code: int) -> None:
    try:
        await websocket.close(code)
    except Exception:  # the socket went away meanwhile
        pass


def install(app: FastAPI) -> None:
    """Add the /live WebSocket route."""
    app.add_api_websocket_route("/live", live)
