"""The results of finished jobs: GET /jobs/{id}/result (the JSON summary, with the URLs of
its files) and GET /jobs/{id}/files/{name} (one file, served from the folder of the row's
attempt)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from app.errors import ApiError
from app.jobs.route import JobRoute
from app.jobs.schemas import RETRY_AFTER_S, found, result_schema

# Result files by extension; anything else is served as bytes.
RESULT_MEDIA_TYPES = {".png": "image/png", ".json": "application/json", ".mp4": "video/mp4"}


def install(router: APIRouter, routes: dict[str, JobRoute]) -> None:
    """The two routes on the /jobs router; `routes`: the kinds whose result schemas the
    OpenAPI shows."""

    @router.get(
        "/{job_id}/result",
        summary="A finished job's result: JSON summary and file URLs",
        responses={
            200: {
                "description": "the result; its `result` has the schema of the job's kind",
                "content": {"application/json": {"schema": result_schema(routes)}},
            }
        },
    )
    async def get_result(request: Request, job_id: str) -> JSONResponse:
        job = await found(request, job_id)
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
        job = await found(request, job_id)
        stored = None
        if job.status == "succeeded":
            stored = await asyncio.to_thread(request.app.state.jobs.result_file, job, name)
        if stored is None:
            shown = name if len(name) <= 80 else f"{name[:80]}..."
            raise ApiError(
                404,
                "file_not_found",
                f"job {job_id} has no result file {shown!r}; GET /jobs/{job_id}/result lists them",
            )
        path, status = stored
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
