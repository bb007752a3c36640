"""How every job kind reads its request, one way for all of them, from its JobSpec
(gpu/spec.py):

- a JSON body, validated strictly by the kind's `body` spec (true is no number);
- or a multipart form: the kind's input files as file parts, and its `options` spec as
  JSON in one text field `params` (`curl -F matrix=@a.npy -F params='{"method": "lapack"}'`).

`receive` reads either; `openapi` documents both, and the result, from the same spec.

Errors: 400 bad_request (malformed JSON or form), 400 missing_<file> (a required file
part is missing), 415 (neither JSON nor a form), 422 invalid_parameter (the options, named
as in a JSON body), 422 use_params_field (options sent as separate form fields, the form
before 0.2).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from starlette.datastructures import UploadFile

from app.errors import ApiError
from app.forms import read_form
from gpu.spec import JobSpec, from_json, json_schema

T = TypeVar("T")
PARAMS_FIELD = "params"


def is_json(request: Request) -> bool:
    return request.headers.get("content-type", "").lower().startswith("application/json")


def is_form(request: Request) -> bool:
    return request.headers.get("content-type", "").lower().startswith("multipart/form-data")


@dataclass
class Upload:
    """A job's multipart form: its file parts (name -> bytes) and its decoded `params` JSON."""

    files: dict[str, bytes]
    params: dict[str, Any]


async def upload_form(
    request: Request, required: tuple[str, ...], optional: tuple[str, ...] = (), example: str = ""
) -> Upload:
    """The form of a job with input files: every `required` file part, the `optional` ones
    present, and the options as JSON in the field `params` (absent: {}). `example` is the
    curl form the error messages show."""
    hint = f"Send the files as file parts and the options as JSON in the field 'params': {example}"
    form = await read_form(
        request, max_files=len(required) + len(optional), max_fields=len(required) + len(optional) + 8, hint=hint
    )
    try:
        files = {}
        for name in (*required, *optional, PARAMS_FIELD):
            if len(form.getlist(name)) > 1:
                raise ApiError(
                    400, "duplicate_field", f"the form has {len(form.getlist(name))} parts named '{name}'; send one"
                )
        for name in (*required, *optional):
            part = form.get(name)
            if part is None and name in optional:
                continue
            if not isinstance(part, UploadFile):
                raise ApiError(400, f"missing_{name}", f"the form needs a file part named '{name}'. {hint}")
            files[name] = await part.read()
        text = form.get(PARAMS_FIELD, "")
        if not isinstance(text, str):
            raise ApiError(400, "bad_request", f"the field '{PARAMS_FIELD}' must be JSON text, not a file. {hint}")
        extra = sorted(key for key in form if key not in files and key != PARAMS_FIELD)
    finally:
        await form.close()
    if extra:
        raise ApiError(
            422,
            "use_params_field",
            (
                f"unknown form field(s) {', '.join(extra)}: options go as one JSON object in the field "
                f"'{PARAMS_FIELD}'. {hint}"
            ),
        )
    try:
        params = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise ApiError(400, "bad_request", f"the field '{PARAMS_FIELD}' is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise ApiError(422, "invalid_parameter", f"{PARAMS_FIELD}: expected a JSON object")
    return Upload(files, params)


def unsupported(detail: str) -> ApiError:
    """415 for a body that is neither JSON nor a form; `detail` says what to send."""
    return ApiError(415, "unsupported_media_type", detail)


def form_schema(files: dict[str, str], required: tuple[str, ...], params_doc: str) -> dict[str, Any]:
    """The OpenAPI schema of a job's multipart form: file parts and the `params` JSON field."""
    properties: dict[str, Any] = {
        name: {"type": "string", "format": "binary", "description": text} for name, text in files.items()
    }
    properties[PARAMS_FIELD] = {"type": "string", "description": params_doc}
    # no other field: upload_form answers 422 use_params_field for any
    return {
        "type": "object",
        "required": list(required),
        "properties": properties,
        "additionalProperties": False,
        "maxProperties": len(properties),
    }


@dataclass
class Received:
    """A job request as its spec reads it: the JSON `body`, or a form's `options` and
    `files` (part name -> bytes); the other one None."""

    body: Any = None
    options: Any = None
    files: dict[str, bytes] | None = None

    async def job(self, from_body: Callable[[Any], T] | None, from_form: Callable[[Any, dict[str, bytes]], T]) -> T:
        """The kind's job: `from_body(body)` (None for a kind without JSON requests), or
        `from_form(options, files)` on a worker thread (it reads and checks the files)."""
        if self.files is None:
            assert from_body is not None, "receive reads a JSON body only for a kind that takes one"
            return from_body(self.body)
        return await asyncio.to_thread(from_form, self.options, self.files)


async def receive(request: Request, spec: JobSpec) -> Received:
    """The request read by `spec`: a JSON body (spec.body) or a multipart form (spec.files
    and spec.options in the field `params`). 400 malformed, 415 neither, 422 invalid."""
    if spec.body is not None and is_json(request):
        return Received(body=from_json(spec.body, await request.body()))
    if spec.options is not None and is_form(request):
        required = tuple(f.name for f in spec.files if f.required)
        optional = tuple(f.name for f in spec.files if not f.required)
        form = await upload_form(request, required, optional, example=spec.form_example)
        # named as in a JSON body (upload_form already answered 400 for params that are not JSON)
        options: Any = from_json(spec.options, json.dumps(form.params))
        return Received(options=options, files=form.files)
    ways = []
    if spec.body is not None:
        ways.append("a JSON body (Content-Type: application/json)")
    if spec.options is not None:
        files = " and ".join(f"'{f.name}'" for f in spec.files)
        ways.append(
            f"a multipart form with the file part(s) {files} and the options as JSON in the field "
            f"'{PARAMS_FIELD}' ({spec.form_example})"
        )
    raise unsupported("send " + ", or ".join(ways))


def openapi(spec: JobSpec, responses: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAPI of POST /jobs/<kind>: its request bodies and its 202, from the spec;
    `responses` adds the kind's own error statuses."""
    content: dict[str, Any] = {}
    if spec.body is not None:
        content["application/json"] = {"schema": json_schema(spec.body), "example": dict(spec.example)}
    if spec.options is not None:
        options = json_schema(spec.options)
        form = form_schema(
            {f.name: f.description for f in spec.files},
            tuple(f.name for f in spec.files if f.required),
            f"the options as a JSON object: {', '.join(options['properties'])}",
        )
        form["properties"][PARAMS_FIELD].update(contentMediaType="application/json", contentSchema=options)
        content["multipart/form-data"] = {"schema": form}
    result = ", ".join(spec.result.model_fields)
    files = f" and the files {spec.result_files}" if spec.result_files else ""
    accepted = {"description": f"the job, queued; poll its Location. The result: {{{result}}}{files}"}
    return {"requestBody": {"required": True, "content": content}, "responses": {"202": accepted, **(responses or {})}}
