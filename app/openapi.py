"""What the OpenAPI document learns when it is first built: the limits the server enforces,
and an example of each error code.

Some limits are settings (upload sizes, pixels, matrix elements, grid points), so the
document is completed from the app's settings: each operation that has limits gets a
"Limits" list in its description and the same list, by setting name, in `x-limits`.
Limits fixed in code sit in the schemas themselves (pydantic bounds, `maxItems`, `oneOf`,
`maxProperties`).

Each error response gets one example per code it may answer (app/errors.py
ERROR_EXAMPLES): the codes of its schema's `enum`, else those its description names, else
its status's usual code; so ReDoc and Swagger UI show a 401 as a 401, not another
status's sample.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from app.config import Settings
from app.errors import ERROR_EXAMPLES
from app.forms import MAX_FIELD_BYTES

Limit = tuple[str, str]  # (setting, sentence)


def _bytes(settings: Settings, field: str, what: str) -> Limit:
    return f"PENCIL_{field.upper()}", f"{what} at most {getattr(settings, field):,} bytes"


def operation_limits(settings: Settings) -> dict[tuple[str, str], list[Limit]]:
    """(method, path) -> the limits of that operation, from `settings`."""
    form_field = ("", f"a non-file form field at most {MAX_FIELD_BYTES:,} bytes")
    job_upload = _bytes(settings, "max_job_upload_bytes", "the request body")
    s = settings
    return {
        ("post", "/sketch"): [
            _bytes(s, "max_upload_bytes", "the image upload"),
            ("PENCIL_MAX_PIXELS", f"the image at most {s.max_pixels:,} pixels (width x height)"),
            form_field,
        ],
        ("post", "/jobs/svd"): [
            job_upload,
            ("PENCIL_MAX_MATRIX_ELEMENTS", f"the matrix at most {s.max_matrix_elements:,} elements (m x n)"),
            form_field,
        ],
        ("post", "/jobs/video"): [
            job_upload,
            ("PENCIL_MAX_PIXELS", f"each frame at most {s.max_pixels:,} pixels"),
            form_field,
        ],
        ("post", "/jobs/cs256"): [
            job_upload,
            ("PENCIL_MAX_CS256_ELEMENTS", f"the matrix at most {s.max_cs256_elements:,} elements, rows padded to 256"),
            form_field,
        ],
        ("post", "/jobs/stencil"): [
            job_upload,
            ("PENCIL_MAX_STENCIL_POINTS", f"the grid at most {s.max_stencil_points:,} points"),
            ("PENCIL_MAX_STENCIL_CPU_POINTS", f"on the CPU backend, at most {s.max_stencil_cpu_points:,} points"),
            ("PENCIL_MAX_STENCIL_POINT_STEPS", f"interior points x steps at most {s.max_stencil_point_steps:,}"),
            (
                "PENCIL_MAX_STENCIL_CPU_POINT_STEPS",
                f"on the CPU backend, interior points x steps at most {s.max_stencil_cpu_point_steps:,}",
            ),
            ("PENCIL_GPU_MEMORY_FRACTION", "on CUDA, the run fits in one device's memory cap"),
            form_field,
        ],
        ("post", "/jobs/search"): [
            job_upload,
            ("PENCIL_MAX_SEARCH_TEXT_BYTES", f"an inline text at most {s.max_search_text_bytes:,} bytes (UTF-8)"),
            ("", "each pattern 1 to 4096 bytes (UTF-8 or base64-decoded)"),
        ],
        ("post", "/corpora"): [_bytes(s, "max_corpus_bytes", "the text")],
    }


def document_limits(app: FastAPI, settings: Settings) -> None:
    """Complete the app's OpenAPI document, when it is first built, with the limits of
    `settings` and the error examples (see the module's docstring)."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for (method, path), limits in operation_limits(settings).items():
                operation = schema["paths"].get(path, {}).get(method)
                if operation is not None:
                    _add_limits(operation, limits)
            for item in schema["paths"].values():
                for operation in item.values():
                    for status, response in operation.get("responses", {}).items():
                        _add_error_examples(int(status), response)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_limits(operation: dict[str, Any], limits: list[Limit]) -> None:
    lines = "\n".join(f"- {sentence}" + (f" (`{setting}`)" if setting else "") for setting, sentence in limits)
    operation["description"] = f"{operation.get('description', '')}\n\n**Limits**\n\n{lines}".strip()
    operation["x-limits"] = [{"setting": setting or None, "limit": sentence} for setting, sentence in limits]


def error_codes(status: int, response: dict[str, Any]) -> list[str]:
    """The codes an error response may answer, for its examples (see the module's docstring)."""
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    enum = schema.get("properties", {}).get("error", {}).get("enum")
    if enum:
        return list(enum)
    description = response.get("description", "")
    named = [
        code
        for code, (code_status, _) in ERROR_EXAMPLES.items()
        if code_status == status and re.search(rf"\b{code}\b", description)
    ]
    return named or [code for code, (code_status, _) in ERROR_EXAMPLES.items() if code_status == status][:1]


def _add_error_examples(status: int, response: dict[str, Any]) -> None:
    media = response.get("content", {}).get("application/json")
    properties = (media or {}).get("schema", {}).get("properties", {})
    if status < 400 or media is None or not {"error", "detail"} <= set(properties):
        return  # not our error shape (FastAPI's validation schema is never answered)
    media["examples"] = {
        code: {"summary": code, "value": {"error": code, "detail": ERROR_EXAMPLES[code][1]}}
        for code in error_codes(status, response)
        if code in ERROR_EXAMPLES
    }
