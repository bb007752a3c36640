"""GET /jobs/{id}/events: a job's changes as server-sent events (text/event-stream), from
any replica, until it has finished:

    event: job        data: the job as GET /jobs/{id} shows it: first, and last once finished
    event: status     data: {"id", "status", "attempt"}: every state it goes through, in order
    event: progress   data: {"id", "progress"}: while it runs, when the fraction moves

The store is read every POLL_S; a state passed through between two reads is still sent,
in its place: the row's `attempt` counts the claims, so queued -> running -> succeeded
between two reads gives both events, and a run lost with its replica (running -> queued
-> running again) too. A comment line every KEEPALIVE_S keeps proxies from closing an
idle stream. At most PENCIL_MAX_EVENT_STREAMS streams per server process (503 past it).

The last event of a finished job carries the id FINISHED: a client (an EventSource) that
reconnects with it as Last-Event-ID gets 204, which tells it to stop. A server process
that is stopping ends its streams within POLL_S (`stop_streams`, called by `pencil-gpu
serve` on SIGTERM), so that a client following a job never holds up a restart; it
reconnects to another process.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.errors import ApiError, error_responses
from app.jobs.schemas import found
from jobs.store import Job, job_body

POLL_S = 0.25
KEEPALIVE_S = 15.0
RETRY_MS = 1000  # how soon a client's EventSource reconnects after the stream ends or breaks
FINISHED = "finished"  # the id of a finished job's last event

_stopping = threading.Event()  # the server process is stopping: open streams end


def stop_streams() -> None:
    """End this process's open streams at their next read (the server is stopping)."""
    _stopping.set()


def passed_through(previous: Job, current: Job) -> list[tuple[str, int]]:
    """The (status, attempt) states a job went through after `previous` up to `current`,
    in order: each claim since (attempt + 1) is a run, preceded by a return to the queue
    when the job was running (its lease lost); then the current status if it differs."""
    states: list[tuple[str, int]] = []
    status, attempt = previous.status, previous.attempt
    while attempt < current.attempt:
        if status == "running":
            states.append(("queued", attempt))
        attempt += 1
        status = "running"
        states.append((status, attempt))
    if current.status != status:
        states.append((current.status, current.attempt))
    return states


def event(name: str, data: dict[str, Any]) -> str:
    """One server-sent event: its name and its JSON data on one line."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


async def stream(request: Request, first: Job) -> AsyncIterator[str]:
    """The events of the job `first` (as read when the stream opened) until it has finished."""
    store = request.app.state.jobs
    last = f"id: {FINISHED}\n" if first.is_finished else ""
    yield f"retry: {RETRY_MS}\n\n" + last + event("job", job_body(first))
    previous, quiet_since = first, time.monotonic()
    while not previous.is_finished and not _stopping.is_set():
        await asyncio.sleep(POLL_S)
        current = await asyncio.to_thread(store.get, first.id)
        if current is None:  # purged: nothing more will happen to it
            return
        chunks = [
            event("status", {"id": current.id, "status": status, "attempt": attempt})
            for status, attempt in passed_through(previous, current)
        ]
        if current.status == "running" and current.progress != previous.progress:
            chunks.append(event("progress", {"id": current.id, "progress": current.progress}))
        if current.is_finished:
            chunks.append(f"id: {FINISHED}\n" + event("job", job_body(current)))
        if chunks:
            yield "".join(chunks)
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > KEEPALIVE_S:
            yield ": keep-alive\n\n"
            quiet_since = time.monotonic()
        previous = current


def install(router: APIRouter) -> None:
    """GET /jobs/{job_id}/events on the /jobs router."""

    @router.get(
        "/{job_id}/events",
        summary="A job's changes as server-sent events, until it has finished",
        response_class=StreamingResponse,
        responses={
            204: {"description": "the job has finished and the request's Last-Event-ID says its end was seen"},
            200: {
                "description": (
                    "text/event-stream: `job` (the job, first and once finished), `status` ({id, status, "
                    "attempt}: every state it goes through), `progress` ({id, progress}) while it runs"
                ),
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            **error_responses({503: "too_many_streams: PENCIL_MAX_EVENT_STREAMS are open on this process"}),
        },
    )
    async def job_events(request: Request, job_id: str) -> Response:
        job = await found(request, job_id)
        if job.is_finished and request.headers.get("last-event-id") == FINISHED:
            return Response(status_code=204)  # a client that saw the end: stop reconnecting
        streams = request.app.state.event_streams
        if streams.locked():
            raise ApiError(
                503,
                "too_many_streams",
                "this server process has as many job event streams open as PENCIL_MAX_EVENT_STREAMS allows; "
                "retry later, or poll GET /jobs/{id}",
                {"Retry-After": "5"},
            )
        await streams.acquire()  # does not wait: not locked, and nothing ran since the check
        return SlotStreamingResponse(
            stream(request, job),
            streams.release,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},  # nginx: pass each event on
        )


class SlotStreamingResponse(StreamingResponse):
    """A stream that gives its slot back (`release`) when it ends, however it ends."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
