"""What the job routes answer and how the OpenAPI shows it: a job's status body
(JobStatus) and its response, a page of them, the error statuses of the routes and the
schema of a result."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from app.errors import INVALID_PARAMETER, ApiError, error_responses
from app.jobs.route import JobRoute
from gpu.spec import json_schema
from jobs.store import STATUSES, Job, job_body


class WebhookState(BaseModel):
    """The delivery of a job's webhook (jobs/webhooks.py)."""

    url: str
    attempts: int = Field(description="POSTs made so far")
    delivered: bool = Field(description="the receiver answered 2xx")
    gave_up: bool = Field(description="no 2xx after the last retry")
    error: str | None = Field(description="what the last failed attempt met")


class JobStatus(BaseModel):
    """A job as the API shows it (job_body); documentation only, the routes build the body."""

    id: str
    kind: str = Field(description="the job kind, the {kind} of POST /jobs/{kind}")
    status: Literal[STATUSES]  # type: ignore[valid-type]
    params: dict[str, Any] = Field(description="the parameters the job runs with, as its kind parsed them")
    created: datetime
    started: datetime | None
    finished: datetime | None
    progress: float = Field(ge=0, le=1, description="0 to 1")
    cancel_requested: bool = Field(description="DELETE was asked while it ran; it stops at its next checkpoint")
    error: str | None = Field(description="why it failed, when it did")
    attempt: int = Field(
        ge=0, description="runs started; more than 1 when a replica running it was lost and another took it over"
    )
    replica: str | None = Field(description="the replica (PENCIL_REPLICA_ID) that runs it or ran it last")
    result_url: str | None = Field(
        description="GET it for the result once the job has succeeded", examples=["/jobs/0f3e2d1c/result"]
    )
    webhook: WebhookState | None = Field(
        None, description="GET /jobs/{id} only, for a job submitted with ?webhook=: its delivery"
    )


class JobList(BaseModel):
    """A page of GET /jobs."""

    jobs: list[JobStatus] = Field(description="newest first")
    next_page_token: str | None = Field(description="the page_token of the next page; null on the last page")


ERRORS = error_responses(
    {
        401: "no or wrong Bearer token",
        404: "no such job",
        409: "Idempotency-Key reused for another request, or the job has no result (yet)",
        422: INVALID_PARAMETER,
        503: (
            "admin_disabled (PENCIL_ADMIN_TOKEN is not set), or storage_unavailable / database_unavailable "
            "(the data directory or the job database cannot be used now; Retry-After)"
        ),
    }
)
SUBMIT_ERRORS = error_responses(
    {
        400: (
            "a malformed body, form or upload (bad_request, empty_file, malformed_npy, ...; the "
            "kind's docs list its codes)"
        ),
        408: "upload_timeout: the body stopped coming (PENCIL_UPLOAD_TIMEOUT_S); the connection is closed",
        413: "the body or the input is over its limit (the detail names the setting)",
        415: "neither JSON nor the multipart form this kind takes",
        507: "insufficient_storage: the server's disk, quota or file-size limit is full",
    }
)


def job_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` whose body is a JobStatus."""
    return {status: {"model": JobStatus, "description": text} for status, text in descriptions.items()}


_LOCATION = {"Location": {"description": "the job's URL, /jobs/{id}", "schema": {"type": "string"}}}
SUBMITTED = {
    status: {**response, "headers": _LOCATION}
    for status, response in job_responses(
        {
            202: "the job, queued; poll its Location",
            200: "an Idempotency-Key seen before: the job it made",
        }
    ).items()
}


def result_schema(routes: dict[str, JobRoute]) -> dict[str, Any]:
    """The body of GET /jobs/{id}/result: `result` is one of the kinds' result schemas."""
    results = [{**json_schema(route.spec.result), "title": f"{route.name} result"} for route in routes.values()]
    return {
        "type": "object",
        "required": ["id", "kind", "result", "files"],
        "properties": {
            "id": {"type": "string"},
            "kind": {"type": "string", "enum": list(routes)},
            "result": {"oneOf": results} if results else {"type": "object"},
            "files": {"type": "object", "additionalProperties": {"type": "string"}, "description": "file name -> URL"},
        },
    }


RETRY_AFTER_S = "2"


def job_response(
    job: Job, status: int = 200, headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None
) -> JSONResponse:
    """The job's status body (and `extra` keys), with Retry-After until it has finished."""
    headers = dict(headers or {})
    if not job.is_finished:
        headers["Retry-After"] = RETRY_AFTER_S
    return JSONResponse({**job_body(job), **(extra or {})}, status_code=status, headers=headers)


async def found(request: Request, job_id: str) -> Job:
    """The job `job_id`, or 404 job_not_found."""
    job = await asyncio.to_thread(request.app.state.jobs.get, job_id)
    if job is None:
        raise ApiError(
            404,
            "job_not_found",
            (
                f"there is no job {job_id!r} (finished jobs are kept "
                f"{request.app.state.settings.job_retention_days:g} days)"
            ),
        )
    return job
