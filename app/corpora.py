"""Corpora: large texts stored once and searched many times (POST /jobs/search with a
`corpus_id`), for operators (Bearer token, as the job endpoints):

    POST   /corpora?name=...   the raw request body is the text (any bytes), streamed to disk
                               (Idempotency-Key honoured, as by POST /jobs/{kind})
    GET    /corpora            list, newest first, with the devices each is resident on
    GET    /corpora/{id}       one corpus
    DELETE /corpora/{id}       delete it (409 while a queued or running search job uses it)

    curl -H "Authorization: Bearer $TOKEN" --data-binary @big.txt 'localhost:8000/corpora?name=big'

The body is streamed to disk (jobs/corpora.py: the layout, and why a 201 survives a power
cut), at most PENCIL_MAX_CORPUS_BYTES (413 past it, also without a Content-Length).
Idempotency-Key: a retry with the key of a stored corpus and the same name and text (its
sha256) answers 200 with that corpus and stores nothing; with another name or text, 409
idempotency_conflict. A storage error is 507 or 503 (jobs/storage.py says which).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from app.errors import ERROR_SCHEMA, INVALID_PARAMETER, ApiError, error_responses
from app.jobs.admin import idempotency_key, require_admin
from gpu import search
from jobs.corpora import MAX_NAME, Corpus, CorpusConflict, CorpusStore, CorpusTooLarge, EmptyCorpus, corpora_dir

log = logging.getLogger("pencil.corpora")


# --------------------------------------------------------------------- routes --

_ERRORS = error_responses(
    {
        401: "no or wrong Bearer token",
        404: "no such corpus",
        422: INVALID_PARAMETER,
        503: (
            "admin_disabled (PENCIL_ADMIN_TOKEN is not set), or storage_unavailable (the data directory cannot "
            "be used now; Retry-After)"
        ),
    }
)

CORPUS_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "name": {"type": ["string", "null"]},
        "bytes": {"type": "integer"},
        "sha256": {"type": "string"},
        "newlines": {"type": "integer"},
        "created": {"type": "string", "format": "date-time"},
        "resident_on": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "GPUs holding it in memory now (searches there skip the upload)",
        },
        "url": {"type": "string"},
    },
}

UPLOAD_OPENAPI = {
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "minLength": 1, "maxLength": 200},
            "description": (
                "a retry with the same key, name and text answers 200 with the corpus first stored; "
                "with another name or text, 409"
            ),
        }
    ],
    "requestBody": {
        "required": True,
        "description": "the text itself, any bytes (curl --data-binary @big.txt); not a multipart form",
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "text/plain": {"schema": {"type": "string"}},
        },
    },
    "responses": {
        "201": {
            "description": "stored; Location: /corpora/{id}",
            "content": {"application/json": {"schema": CORPUS_SCHEMA}},
        },
        "200": {
            "description": "an Idempotency-Key seen before with the same name and text: the corpus it stored",
            "content": {"application/json": {"schema": CORPUS_SCHEMA}},
        },
        "400": {
            "description": "empty body, or bad_idempotency_key",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        },
        "413": {
            "description": "larger than PENCIL_MAX_CORPUS_BYTES",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        },
        "409": {
            "description": "idempotency_conflict: the Idempotency-Key was used for another name or text",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        },
        "415": {
            "description": "a multipart form instead of the raw text",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        },
        "507": {
            "description": "insufficient_storage: the server's disk, quota or file-size limit is full",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        },
    },
}


def _body(corpus: Corpus) -> dict[str, Any]:
    return corpus.body(search.resident_devices(corpus.id))


def _store(request: Request) -> CorpusStore:
    return request.app.state.corpora


def _found(request: Request, corpus_id: str) -> Corpus:
    corpus = _store(request).get(corpus_id)
    if corpus is None:
        raise ApiError(404, "corpus_not_found", f"there is no corpus {corpus_id!r}; GET /corpora lists them")
    return corpus


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"the corpus is larger than {limit:,} bytes (PENCIL_MAX_CORPUS_BYTES)")


def _jobs_using(request: Request, corpus_id: str) -> list[str]:
    """Ids of the queued or running search jobs of this corpus."""
    store = request.app.state.jobs
    using = []
    for status in ("queued", "running"):
        after = None
        while True:
            jobs, after = store.page(status, "search", 500, after)
            using += [job.id for job in jobs if job.params.get("corpus_id") == corpus_id]
            if after is None:
                break
    return using


def install(app: FastAPI) -> None:
    settings = app.state.settings
    app.state.corpora = CorpusStore(corpora_dir(settings.data_dir))
    search.configure_residency(settings.search_resident_fraction)
    router = APIRouter(prefix="/corpora", tags=["corpora"], dependencies=[Depends(require_admin)], responses=_ERRORS)

    @router.post(
        "",
        summary="Store a text to search (the raw request body)",
        status_code=201,
        openapi_extra=UPLOAD_OPENAPI,
        response_class=JSONResponse,
    )
    async def upload(
        request: Request,
        name: Annotated[str | None, Query(max_length=MAX_NAME, description="a label for the corpus")] = None,
    ) -> JSONResponse:
        if name is not None and (not name.strip() or any(ord(c) < 32 or ord(c) == 127 for c in name)):
            raise ApiError(422, "invalid_parameter", "name: must be non-blank printable text")
        if request.headers.get("content-type", "").lower().startswith("multipart/"):
            raise ApiError(
                415,
                "unsupported_media_type",
                "send the text as the raw request body (curl --data-binary @big.txt), not as a multipart form",
            )
        key = idempotency_key(request)
        limit = request.app.state.settings.max_corpus_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        try:
            corpus, created = await _store(request).create(name, request.stream(), limit, key)
        except CorpusTooLarge:
            raise _too_large(limit) from None
        except EmptyCorpus:
            raise ApiError(
                400,
                "empty_corpus",
                "the request body is empty: send the text as the raw body (curl --data-binary @big.txt)",
            ) from None
        except CorpusConflict as exc:
            raise ApiError(
                409,
                "idempotency_conflict",
                f"Idempotency-Key {key!r} was used for a different name or text (corpus {exc.corpus.id})",
            ) from None
        if created:
            log.info("stored corpus %s (%s, %d bytes)", corpus.id, corpus.name, corpus.bytes)
        return JSONResponse(
            _body(corpus), status_code=201 if created else 200, headers={"Location": f"/corpora/{corpus.id}"}
        )

    @router.get("", summary="List corpora, newest first")
    async def list_corpora(request: Request) -> dict[str, Any]:
        corpora = await asyncio.to_thread(_store(request).list)
        return {"corpora": [_body(c) for c in corpora], "total_bytes": sum(c.bytes for c in corpora)}

    @router.get(
        "/{corpus_id}",
        summary="One corpus",
        responses={200: {"content": {"application/json": {"schema": CORPUS_SCHEMA}}}},
    )
    async def get_corpus(request: Request, corpus_id: str) -> dict[str, Any]:
        return _body(_found(request, corpus_id))

    @router.delete(
        "/{corpus_id}",
        summary="Delete a corpus (not while a queued or running search uses it)",
        responses=error_responses({409: "a search job uses it"}),
    )
    async def delete_corpus(request: Request, corpus_id: str) -> dict[str, Any]:
        corpus = _found(request, corpus_id)
        using = await asyncio.to_thread(_jobs_using, request, corpus_id)
        if using:
            raise ApiError(
                409,
                "corpus_in_use",
                (
                    f"search job(s) {', '.join(using[:5])}{' and more' if len(using) > 5 else ''} use corpus "
                    f"{corpus_id}; cancel them or wait, then delete"
                ),
            )
        body = _body(corpus)
        # A search submitted between the check above and the unlisting (here or on another
        # replica) is accepted and then fails when it runs: "corpus not found".
        if not _store(request).unlist(corpus_id):
            raise ApiError(404, "corpus_not_found", f"there is no corpus {corpus_id!r}; GET /corpora lists them")
        await asyncio.to_thread(_store(request).remove_text, corpus_id)
        search.evict_corpus(corpus_id)
        return {**body, "deleted": True, "resident_on": []}

    app.include_router(router)
