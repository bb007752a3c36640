"""Multipart forms of the upload endpoints, read within bounds, with a malformed form
answered as our 400 JSON error."""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import ApiError
from jobs.storage import storage_errors

MAX_FIELD_BYTES = 64 * 1024  # a non-file field (an option) is short


async def read_form(request: Request, max_files: int, max_fields: int, hint: str) -> FormData:
    """The request's multipart form (files spooled by Starlette); the caller closes it.
    Raises ApiError 400 `bad_request` for a malformed form, with `hint` on how to send it,
    and StorageError when the spooled files cannot be written (a full temporary directory)."""
    try:
        with storage_errors("receive the upload (temporary files)"):
            return await request.form(max_files=max_files, max_fields=max_fields, max_part_size=MAX_FIELD_BYTES)
    except StarletteHTTPException as exc:
        if exc.status_code != 400:
            raise
        raise ApiError(400, "bad_request", f"{exc.detail} {hint}") from None
