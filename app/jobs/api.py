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
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from app.errors import ApiError, error_responses
from app.jobs import events, results
from app.jobs.admin import idempotency_key, require_admin
from app.jobs.route import JobRoute
from app.jobs.schemas import (
    ERRORS,
    SUBMIT_ERRORS,
    SUBMITTED,
    JobList,
    found,
    job_body,
    job_response,
    job_responses,
)
from app.logs import current_request_id
from jobs.store import STATUSES, IdempotencyConflict
from jobs.webhooks import check_url, delivery_state


def install(app: FastAPI, routes: dict[str, JobRoute]) -> None:
    router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=[Depends(require_admin)], responses=ERRORS)

    for route in routes.values():
        router.post(
            f"/{route.name}",
            summary=route.spec.summary,
            status_code=202,
            openapi_extra=route.openapi,
            response_class=JSONResponse,
            responses={**SUBMITTED, **SUBMIT_ERRORS},
        )(submit_endpoint(route))

    results.install(router, routes)
    events.install(router)

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
        responses=job_responses({200: "the job (with Retry-After until it has finished)"}),
    )
    async def get_job(request: Request, job_id: str) -> JSONResponse:
        job = await found(request, job_id)
        webhook = await asyncio.to_thread(delivery_state, request.app.state.jobs, job_id)
        return job_response(job, extra={"webhook": webhook} if webhook is not None else None)

    @router.delete(
        "/{job_id}",
        summary="Cancel a job (a running one stops at its next checkpoint)",
        responses=job_responses(
            {
                200: "canceled (it was queued)",
                202: "a running job: the cancel is asked for and honoured at its next checkpoint; poll the job",
            }
        ),
    )
    async def cancel_job(request: Request, job_id: str) -> JSONResponse:
        job = await found(request, job_id)
        if job.is_finished:
            raise ApiError(409, "job_finished", f"job {job_id} already {job.status}")
        job = await asyncio.to_thread(request.app.state.jobs.cancel, job_id)
        if job.is_finished:  # canceled while queued: the runner never sees it
            request.app.state.metrics.jobs_finished.labels(job.kind, job.status).inc()
        return job_response(job, 200 if job.is_finished else 202)

    app.include_router(router)


def submit_endpoint(route: JobRoute) -> Callable[[Request], Awaitable[JSONResponse]]:
    """The handler of POST /jobs/<route.name>: validate, store, 202 + Location (200 for an
    Idempotency-Key seen before with the same request, 409 with another)."""

    async def submit(request: Request) -> JSONResponse:
        state = request.app.state
        key = idempotency_key(request)
        webhook = webhook_url(request)
        submission = await route.parse(request, state.settings)
        try:
            digest = submission.digest(route.name, webhook) if key else None
            job, created = await asyncio.to_thread(
                state.jobs.create,
                route.name,
                submission.params,
                submission.inputs,
                key,
                digest,
                current_request_id(),
                webhook,
            )
        except IdempotencyConflict as exc:
            raise ApiError(
                409,
                "idempotency_conflict",
                f"Idempotency-Key {key!r} was used for a different request (job {exc.job.id})",
            ) from None
        if created:
            state.job_runner.notify()
        return job_response(job, 202 if created else 200, {"Location": f"/jobs/{job.id}"})

    return submit


def webhook_url(request: Request) -> str | None:
    """The submission's `webhook` query parameter (jobs/webhooks.py), checked: 422 when it
    is no http(s) URL or the server has no PENCIL_WEBHOOK_SECRET to sign with."""
    url = request.query_params.get("webhook")
    if url is None:
        return None
    reason = check_url(url)
    if reason is not None:
        raise ApiError(422, "invalid_parameter", f"webhook: must be {reason}")
    if request.app.state.settings.webhook_secret is None:
        raise ApiError(
            422,
            "invalid_parameter",
            "webhook: this server signs no webhooks (PENCIL_WEBHOOK_SECRET is not set); poll the job or "
            "follow GET /jobs/{id}/events instead",
        )
    return url
