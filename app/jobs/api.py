"""The batch-job HTTP API, for operators (Bearer token):

    POST   /jobs/{kind}            validate now, store, 202 + Location (Idempotency-Key honoured)
    GET    /jobs                   list, newest first (?status=&kind=&page_size=&page_token=)
    GET    /jobs/{id}              status, progress, error, result_url (Retry-After until finished)
    GET    /jobs/{id}/result       the result summary (JSON) with the URLs of its files
    GET    /jobs/{id}/files/{name} one result file (.npy, .npz, .png, .json, .safetensors)
    DELETE /jobs/{id}              cancel: a queued job at once, a running one at its next checkpoint

Routes stay thin: a kind's parser validates and builds the submission, the store keeps it,
the runner runs it.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from app.errors import INVALID_PARAMETER, ApiError, error_responses
from app.jobs.route import JobRoute
from app.logs import current_request_id
from gpu.spec import json_schema
from jobs.store import STATUSES, IdempotencyConflict, Job

RETRY_AFTER_S = "2"
MAX_IDEMPOTENCY_KEY = 200


# Declares the scheme in the OpenAPI (Swagger UI's "Authorize"); require_admin answers in our error shape.
BEARER = HTTPBearer(auto_error=False, scheme_name="adminToken", description="the PENCIL_ADMIN_TOKEN of the server")


def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
) -> None:
    """The Bearer token of PENCIL_ADMIN_TOKEN, compared in constant time."""
    token = request.app.state.settings.admin_token
    if not token:
        raise ApiError(
            503,
            "admin_disabled",
            (
                "batch jobs are disabled: set PENCIL_ADMIN_TOKEN (environment or .env) to a secret and "
                "restart, then send it as 'Authorization: Bearer <token>'"
            ),
        )
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise ApiError(
            401,
            "unauthorized",
            "this endpoint needs 'Authorization: Bearer <PENCIL_ADMIN_TOKEN>'",
            {"WWW-Authenticate": "Bearer"},
        )


def idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key header, or None; 400 bad_idempotency_key when it is
    empty or longer than MAX_IDEMPOTENCY_KEY characters."""
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise ApiError(400, "bad_idempotency_key", f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters")
    return key


def _iso(t: float | None) -> str | None:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds") if t is not None else None


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


class JobList(BaseModel):
    """A page of GET /jobs."""

    jobs: list[JobStatus] = Field(description="newest first")
    next_page_token: str | None = Field(description="the page_token of the next page; null on the last page")


def job_body(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "status": job.status,
        "params": job.params,
        "created": _iso(job.created),
        "started": _iso(job.started),
        "finished": _iso(job.finished),
        "progress": job.progress,
        "cancel_requested": job.cancel_requested,
        "error": job.error,
        "attempt": job.attempt,
        "replica": job.replica,
        "result_url": f"/jobs/{job.id}/result" if job.status == "succeeded" else None,
    }


def _job_response(job: Job, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if not job.is_finished:
        headers["Retry-After"] = RETRY_AFTER_S
    return JSONResponse(job_body(job), status_code=status, headers=headers)


async def _found(request: Request, job_id: str) -> Job:
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


_ERRORS = error_responses(
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
_SUBMIT_ERRORS = error_responses(
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


def _job_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` whose body is a JobStatus."""
    return {status: {"model": JobStatus, "description": text} for status, text in descriptions.items()}


_LOCATION = {"Location": {"description": "the job's URL, /jobs/{id}", "schema": {"type": "string"}}}
_SUBMITTED = {
    status: {**response, "headers": _LOCATION}
    for status, response in _job_responses(
        {
            202: "the job, queued; poll its Location",
            200: "an Idempotency-Key seen before: the job it made",
        }
    ).items()
}


def _result_schema(routes: dict[str, JobRoute]) -> dict[str, Any]:
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


def _submit_route(route: JobRoute) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def submit(request: Request) -> JSONResponse:
        state = request.app.state
        key = idempotency_key(request)
        submission = await route.parse(request, state.settings)
        try:
            digest = submission.digest(route.name) if key else None
            job, created = await asyncio.to_thread(
                state.jobs.create, route.name, submission.params, submission.inputs, key, digest, current_request_id()
            )
        except IdempotencyConflict as exc:
            raise ApiError(
                409,
                "idempotency_conflict",
                f"Idempotency-Key {key!r} was used for a different request (job {exc.job.id})",
            ) from None
        if created:
            state.job_runner.notify()
        return _job_response(job, 202 if created else 200, {"Location": f"/jobs/{job.id}"})

    return submit


# Result files by extension; anything else is served as bytes.
RESULT_MEDIA_TYPES = {".png": "image/png", ".json": "application/json", ".mp4": "video/mp4"}


def install(app: FastAPI, routes: dict[str, JobRoute]) -> None:
    router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=[Depends(require_admin)], responses=_ERRORS)

    for route in routes.values():
        router.post(
            f"/{route.name}",
            summary=route.spec.summary,
            status_code=202,
            openapi_extra=route.openapi,
            response_class=JSONResponse,
            responses={**_SUBMITTED, **_SUBMIT_ERRORS},
        )(_submit_route(route))

    @router.post("/{kind}", summary="Unknown job kinds answer 404", include_in_schema=False)
    async def unknown_kind(kind: str) -> None:
        raise ApiError(
            404, "unknown_job_kind", f"no job kind {kind!r}; this server runs: {', '.join(sorted(routes)) or 'none'}"
        )

    @router.get(
        "",
        summary="List jobs, newest first",
        response_model=None,  # the body stays job_body's, as built
        responses={
            200: {"model": JobList, "description": "a page of jobs"},
            **error_responses({400: "bad_page_token: not a next_page_token of this list"}),
        },
    )
    async def list_jobs(
        request: Request,
        status: Annotated[
            str | None, Query(description="only jobs in this state", json_schema_extra={"enum": list(STATUSES)})
        ] = None,
        kind: Annotated[str | None, Query(description="only jobs of this kind")] = None,
        page_size: Annotated[int, Query(ge=1, le=500)] = 50,
        page_token: Annotated[str | None, Query(description="next_page_token of the previous page")] = None,
    ) -> dict[str, Any]:
        if status is not None and status not in STATUSES:
            raise ApiError(422, "invalid_parameter", f"status: must be one of {', '.join(STATUSES)}")
        store = request.app.state.jobs
        if page_token is not None and await asyncio.to_thread(store.get, page_token) is None:
            raise ApiError(
                400, "bad_page_token", "page_token is not a next_page_token of this list (or its job was deleted)"
            )
        jobs, next_token = await asyncio.to_thread(store.page, status, kind, page_size, page_token)
        return {"jobs": [job_body(job) for job in jobs], "next_page_token": next_token}

    @router.get(
        "/{job_id}",
        summary="A job's status and progress",
        responses=_job_responses({200: "the job (with Retry-After until it has finished)"}),
    )
    async def get_job(request: Request, job_id: str) -> JSONResponse:
        return _job_response(await _found(request, job_id))

    @router.get(
        "/{job_id}/result",
        summary="A finished job's result: JSON summary and file URLs",
        responses={
            200: {
                "description": "the result; its `result` has the schema of the job's kind",
                "content": {"application/json": {"schema": _result_schema(routes)}},
            }
        },
    )
    async def get_result(request: Request, job_id: str) -> JSONResponse:
        job = await _found(request, job_id)
        if job.status != "succeeded":
            if job.is_finished:
                raise ApiError(409, f"job_{job.status}", f"job {job_id} {job.status}: {job.error}")
            raise ApiError(
                409,
                "job_not_finished",
                f"job {job_id} is {job.status} ({job.progress:.0%}); poll /jobs/{job_id}",
                {"Retry-After": RETRY_AFTER_S},
            )
        names = await asyncio.to_thread(request.app.state.jobs.result_names, job)
        files = {name: f"/jobs/{job_id}/files/{name}" for name in names}
        return JSONResponse({"id": job.id, "kind": job.kind, "result": job.result, "files": files})

    @router.get("/{job_id}/files/{name}", summary="One result file", response_class=FileResponse)
    async def get_file(request: Request, job_id: str, name: str) -> FileResponse:
        job = await _found(request, job_id)
        found = None
        if job.status == "succeeded":
            found = await asyncio.to_thread(request.app.state.jobs.result_file, job, name)
        if found is None:
            shown = name if len(name) <= 80 else f"{name[:80]}..."
            raise ApiError(
                404,
                "file_not_found",
                f"job {job_id} has no result file {shown!r}; GET /jobs/{job_id}/result lists them",
            )
        path, status = found
        media_type = RESULT_MEDIA_TYPES.get(path.suffix, "application/octet-stream")
        # images are shown in the browser (the jobs page links them); arrays are downloads
        disposition = "inline" if media_type.startswith("image/") else "attachment"
        return FileResponse(
            path,
            media_type=media_type,
            filename=f"{job_id}-{name}",
            content_disposition_type=disposition,
            stat_result=status,  # the lstat result_file checked: no second look at the path
        )

    @router.delete(
        "/{job_id}",
        summary="Cancel a job (a running one stops at its next checkpoint)",
        responses=_job_responses(
            {
                200: "canceled (it was queued)",
                202: "a running job: the cancel is asked for and honoured at its next checkpoint; poll the job",
            }
        ),
    )
    async def cancel_job(request: Request, job_id: str) -> JSONResponse:
        job = await _found(request, job_id)
        if job.is_finished:
            raise ApiError(409, "job_finished", f"job {job_id} already {job.status}")
        job = await asyncio.to_thread(request.app.state.jobs.cancel, job_id)
        if job.is_finished:  # canceled while queued: the runner never sees it
            request.app.state.metrics.jobs_finished.labels(job.kind, job.status).inc()
        return _job_response(job, 200 if job.is_finished else 202)

    app.include_router(router)
