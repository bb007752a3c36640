"""POST /sketch: an uploaded photo in, a pencil drawing out.

The upload is a multipart form (field `image`) or, for scripts, the raw image as the
request body with an `image/*` Content-Type. Options come as form fields or query
parameters (a form field wins); they are described once in `PENCIL_OPTIONS` and
`ENCODE_OPTIONS`, from which both the parsing and the OpenAPI description are built.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request, Response
from starlette.datastructures import UploadFile

from app.errors import ERROR_SCHEMA, ApiError
from app.forms import read_form
from gpu import pencil
from gpu.codec.decode import open_image
from gpu.codec.encode import ENCODE_OPTIONS, EXTENSIONS, MEDIA_TYPES, check_encodable, parse_encode_options
from gpu.pencil.params import (
    PENCIL_OPTIONS,
    Option,
    ParamError,
    PencilParams,
    fitted_size,
)

ALL_OPTIONS: tuple[Option, ...] = PENCIL_OPTIONS + ENCODE_OPTIONS
_OPTION_NAMES = {option.name for option in ALL_OPTIONS}


def _error_response(description: str, codes: tuple[str, ...]) -> dict[str, Any]:
    schema = {
        **ERROR_SCHEMA,
        "properties": {**ERROR_SCHEMA["properties"], "error": {"type": "string", "enum": list(codes)}},
    }
    return {
        "description": f"{description}. Codes: {', '.join(codes)}",
        "content": {"application/json": {"schema": schema}},
    }


_image_headers = {
    "X-Backend": {"description": "backend that rendered: cuda or cpu", "schema": {"type": "string"}},
    "X-Render-Ms": {
        "description": "decode + render + encode time in ms, excluding queue wait",
        "schema": {"type": "number"},
    },
    "X-Queue-Ms": {"description": "time spent waiting for a render worker, in ms", "schema": {"type": "number"}},
    "X-Image-Size": {"description": "size of the drawing, WIDTHxHEIGHT in px", "schema": {"type": "string"}},
    "X-Codecs": {
        "description": "where the photo was decoded and the drawing encoded: `decode gpu|cpu, encode gpu|cpu`",
        "schema": {"type": "string"},
    },
}

OPENAPI = {
    "parameters": [{"name": o.name, "in": "query", "required": False, "schema": o.json_schema()} for o in ALL_OPTIONS],
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "format": "binary", "description": "the photo: JPEG, PNG or WebP"},
                        **{o.name: o.json_schema() for o in ALL_OPTIONS},
                    },
                },
            },
            "image/*": {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "the photo as the raw body (options as query parameters)",
                }
            },
        },
    },
    "responses": {
        "200": {
            "description": "the drawing",
            "headers": _image_headers,
            "content": {media: {"schema": {"type": "string", "format": "binary"}} for media in MEDIA_TYPES.values()},
        },
        "400": _error_response(
            (
                "no `image` field, empty, corrupt or truncated file, image smaller than 16 px, malformed form, "
                "two `image` fields or an option given twice in the form or the query string, or (OPTIONS) a CORS "
                "preflight from a page not in PENCIL_CORS_ORIGINS"
            ),
            (
                "missing_image",
                "empty_file",
                "corrupt_image",
                "image_too_small",
                "bad_request",
                "duplicate_field",
                "cors_refused",
            ),
        ),
        "401": _error_response(
            "API keys are on (PENCIL_API_KEYS) and the request has no known key: send 'Authorization: Bearer <key>'",
            ("unauthorized",),
        ),
        "408": _error_response(
            (
                "the upload stalled for PENCIL_UPLOAD_TIMEOUT_S or came slower than PENCIL_UPLOAD_MIN_BYTES_PER_S; "
                "the connection is closed"
            ),
            ("upload_timeout",),
        ),
        "413": _error_response(
            (
                "image larger than PENCIL_MAX_UPLOAD_BYTES (with or without Content-Length), or more "
                "pixels than PENCIL_MAX_PIXELS (decided from the header, before decoding)"
            ),
            ("too_large", "too_many_pixels"),
        ),
        "415": _error_response(
            "not a JPEG, PNG or WebP, or a request body that is neither a form nor an image",
            ("unsupported_format", "unsupported_media_type"),
        ),
        "422": _error_response(
            (
                "an option out of range or not one of its choices (`detail` names it), or a drawing too "
                "large for the chosen format (WebP: 16383 px a side, JPEG: 65500)"
            ),
            ("invalid_parameter", "too_large_for_format"),
        ),
        "429": _error_response(
            "this client (its API key, else its address) is over PENCIL_RATE_LIMIT; see the Retry-After header",
            ("rate_limited",),
        ),
        "500": _error_response("a bug: the server logged it and keeps serving", ("internal_error",)),
        "503": _error_response(
            (
                "too many renders already waiting, no GPU free in time, the GPU out of memory, or the "
                "server is stopping; see the Retry-After header"
            ),
            ("overloaded", "shutting_down", "gpu_out_of_memory"),
        ),
    },
}


async def _read_upload(request: Request, max_bytes: int) -> tuple[bytes, str, dict[str, str]]:
    """The image bytes, its file name, and the options given as form fields."""
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("image/") or content_type.startswith("application/octet-stream"):
        fields: dict[str, str] = {}
        data, filename = await request.body(), "image"
    elif content_type.startswith("multipart/form-data"):
        data, filename, fields = await _read_form(request)
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            (
                "send the photo as multipart/form-data with a field named 'image' (curl -F "
                "image=@photo.jpg), or as the raw body with an image/* Content-Type"
            ),
        )
    if len(data) > max_bytes:
        raise ApiError(
            413, "too_large", f"the image is {len(data):,} bytes; uploads are limited to {max_bytes:,} bytes"
        )
    return data, filename, fields


async def _read_form(request: Request) -> tuple[bytes, str, dict[str, str]]:
    form = await read_form(
        request,
        max_files=4,
        max_fields=len(ALL_OPTIONS) + 8,
        hint="The photo must be a file part: curl -F image=@photo.jpg",
    )
    try:
        if (count := len(form.getlist("image"))) > 1:
            raise ApiError(
                400, "duplicate_field", f"the form has {count} fields named 'image'; send one image a request"
            )
        upload = form.get("image")
        if upload is None:
            given = ", ".join(sorted(set(form.keys()))) or "none"
            raise ApiError(400, "missing_image", f"the form has no field named 'image' (fields sent: {given})")
        if not isinstance(upload, UploadFile):
            raise ApiError(
                400,
                "missing_image",
                "the 'image' field must be a file upload, not a text value (curl -F image=@photo.jpg)",
            )
        data = await upload.read()
        fields = _given_options([(key, value) for key, value in form.multi_items() if isinstance(value, str)], "form")
        return data, upload.filename or "image", fields
    finally:
        await form.close()


def _given_options(items: list[tuple[str, str]], where: str) -> dict[str, str]:
    """The options among `items` (name, value) of the form or the query string; ApiError
    400 `duplicate_field` when one is given twice there (which one to take is a guess)."""
    options: dict[str, str] = {}
    repeated = set()
    for key, value in items:
        if key in _OPTION_NAMES:
            if key in options:
                repeated.add(key)
            options[key] = value
    if repeated:
        raise ApiError(
            400,
            "duplicate_field",
            f"the {where} gives the option(s) {', '.join(sorted(repeated))} more than once; give each option once",
        )
    return options


def parse_options(query: dict[str, str], form: dict[str, str]) -> tuple[PencilParams, str, int]:
    """Options from the query string and the form (form wins) -> (params, format, quality).
    Raises ApiError 422 naming the offending option."""
    raw = {**query, **form}
    try:
        params = PencilParams.from_options(raw)
        fmt, quality = parse_encode_options(raw)
    except ParamError as exc:
        raise ApiError(422, "invalid_parameter", str(exc)) from None
    return params, fmt, quality


def content_disposition(name: str) -> str:
    """`inline` with the name as ASCII (unsafe characters as _) and, for any other
    character, as RFC 5987 UTF-8 too; header values must stay Latin-1."""
    name = name[-120:]
    ascii_name = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in name)
    if ascii_name == name:
        return f'inline; filename="{name}"'
    return f"inline; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


async def sketch(request: Request) -> Response:
    state = request.app.state
    settings, backend, queue = state.settings, state.backend, state.render_queue
    queue.refuse_if_full()  # before the upload: app/uploads.py drops a bounded part of it after the 503
    data, filename, form_options = await _read_upload(request, settings.max_upload_bytes)
    query_options = _given_options(request.query_params.multi_items(), "query string")
    params, fmt, quality = parse_options(query_options, form_options)
    # From the header alone: bad files, bombs and undrawable sizes fail before any queueing.
    photo = open_image(data, settings.max_pixels)
    out_height, out_width = fitted_size(photo.height, photo.width, params.max_side)
    check_encodable(out_width, out_height, fmt)  # only the longer side matters: EXIF rotation cannot change it

    def job() -> pencil.Drawing:
        return pencil.draw_bytes(data, photo, params, fmt, quality, backend.name, pool=state.pool)

    timed = await queue.run(job, pixels=out_width * out_height, receive=request.receive)
    drawing = timed.value
    download_name = f"{PurePath(filename).stem or 'image'}-sketch.{EXTENSIONS[fmt]}"
    return Response(
        content=drawing.data,
        media_type=MEDIA_TYPES[fmt],
        headers={
            "X-Backend": backend.name,
            "X-Render-Ms": f"{timed.run_ms:.1f}",
            "X-Queue-Ms": f"{timed.queue_ms:.1f}",
            "X-Image-Size": f"{drawing.width}x{drawing.height}",
            "X-Codecs": f"decode {drawing.decoded_on}, encode {drawing.encoded_on}",
            "Content-Disposition": content_disposition(download_name),
            "Cache-Control": "no-store",
        },
    )


def install(app: FastAPI) -> None:
    """Add POST /sketch to the app (directly on the app, so the route is a plain route
    that the metrics can name even when a middleware answers before routing)."""
    app.post(
        "/sketch",
        summary="Turn a photo into a pencil drawing",
        tags=["sketch"],
        description=(
            "Upload a JPEG, PNG or WebP photo; get the drawing back as an image. Every option may be "
            "a form field or a query parameter."
        ),
        openapi_extra=OPENAPI,
        response_class=Response,
    )(sketch)
