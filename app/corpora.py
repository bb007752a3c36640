"""Corpora: large texts stored once and searched many times (POST /jobs/search with a
`corpus_id`), for operators (Bearer token, as the job endpoints):

    POST   /corpora?name=...   the raw request body is the text (any bytes), streamed to disk
    GET    /corpora            list, newest first, with the devices each is resident on
    GET    /corpora/{id}       one corpus
    DELETE /corpora/{id}       delete it (409 while a queued or running search job uses it)

    curl -H "Authorization: Bearer $TOKEN" --data-binary @big.txt 'localhost:8000/corpora?name=big'

Storage, beside the job store under PENCIL_DATA_DIR:

    <data_dir>/corpora/<id>.bin      the text, byte for byte
    <data_dir>/corpora/<id>.json     its metadata: id, name, bytes, sha256, newlines, created

The body is read in the chunks the server receives and written in blocks of at most
FLUSH_BYTES on a worker thread (hashing and counting newlines on the way): the server
never holds more than one block of it. It goes to a hidden partial file, is flushed to
disk, then renamed; the metadata file is written (atomically) last, so a corpus that is
listed is complete, and a restart keeps every listed corpus (and removes partial ones).
The directory is synced after each rename, so a 201 survives a power cut.
At most PENCIL_MAX_CORPUS_BYTES (413 past it, also without a Content-Length).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, BinaryIO

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from app.errors import ERROR_SCHEMA, INVALID_PARAMETER, ApiError, error_responses
from app.jobs.api import require_admin
from gpu.search.residency import RESIDENT

log = logging.getLogger("pencil.corpora")

FLUSH_BYTES = 8 * 1024 * 1024  # body bytes held before they are written out
MAX_NAME = 200
CORPUS_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class Corpus:
    id: str
    name: str | None
    bytes: int
    sha256: str
    newlines: int
    created: float

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the text in device memory (gpu.search.residency)."""
        return (self.id, self.sha256)

    def body(self) -> dict[str, Any]:
        out = asdict(self)
        out["created"] = datetime.fromtimestamp(self.created, UTC).isoformat(timespec="milliseconds")
        out["resident_on"] = RESIDENT.resident_devices(lambda key: key[0] == self.id)
        out["url"] = f"/corpora/{self.id}"
        return out


class CorpusTooLarge(Exception):
    pass


STALE_AFTER_S = 3600.0  # a leftover file untouched this long belongs to no live upload


def _untouched_for(path: Path, seconds: float) -> bool:
    """Whether `path` was last modified more than `seconds` ago (False if it is gone)."""
    try:
        return time.time() - path.stat().st_mtime > seconds
    except FileNotFoundError:
        return False


class CorpusStore:
    """The corpora of one data directory (see the module docstring for the layout)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cleanup()

    def _cleanup(self) -> None:
        """Remove what an interrupted upload or delete left: partial files, texts without
        metadata (written last), metadata without a text. Only what has not changed for
        STALE_AFTER_S: another server process may be writing the newer ones right now."""
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if not _untouched_for(path, STALE_AFTER_S):
                continue
            if path.name.startswith(".") and path.name.endswith(".partial"):
                stale = True
            elif path.suffix in (".bin", ".json") and CORPUS_ID.match(path.stem):
                stale = not path.with_suffix(".json" if path.suffix == ".bin" else ".bin").exists()
            else:
                stale = False
            if stale:
                log.info("removing %s, left by an interrupted upload or delete", path.name)
                path.unlink(missing_ok=True)

    def text_path(self, corpus_id: str) -> Path:
        return _text_file(self.root, corpus_id)

    def get(self, corpus_id: str) -> Corpus | None:
        if not CORPUS_ID.match(corpus_id):
            return None
        try:
            return Corpus(**json.loads((self.root / f"{corpus_id}.json").read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def list(self) -> list[Corpus]:
        """Every corpus, newest first."""
        if not self.root.is_dir():
            return []
        found = [self.get(path.stem) for path in self.root.glob("*.json")]
        return sorted((c for c in found if c is not None), key=lambda c: (c.created, c.id), reverse=True)

    async def create(self, name: str | None, chunks: AsyncIterator[bytes], limit: int) -> Corpus:
        """Store the text arriving in `chunks`; raises CorpusTooLarge past `limit` bytes and
        ApiError for an empty body (nothing is left behind on any error)."""
        self.root.mkdir(parents=True, exist_ok=True)
        corpus_id = uuid.uuid4().hex
        partial = self.root / f".{corpus_id}.partial"
        digest = hashlib.sha256()
        size = newlines = 0
        handle = await asyncio.to_thread(open, partial, "wb", buffering=0)  # blocks go straight to the file

        def write(block: bytes) -> int:
            view = memoryview(block)
            while view:
                view = view[handle.write(view) :]
            digest.update(block)
            return block.count(b"\n")

        try:
            block = bytearray()
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise CorpusTooLarge()
                block += chunk
                if len(block) >= FLUSH_BYTES:
                    full, block = block, bytearray()
                    newlines += await asyncio.to_thread(write, bytes(full))
            if block:
                newlines += await asyncio.to_thread(write, bytes(block))
            if size == 0:
                raise ApiError(
                    400,
                    "empty_corpus",
                    "the request body is empty: send the text as the raw body (curl --data-binary @big.txt)",
                )
            await asyncio.to_thread(_flush, handle)
            handle.close()
            text = self.text_path(corpus_id)
            partial.rename(text)
            await asyncio.to_thread(_fsync_directory, self.root)
            corpus = Corpus(corpus_id, name, size, digest.hexdigest(), newlines, time.time())
            await asyncio.to_thread(
                _write_atomically, self.root / f"{corpus_id}.json", json.dumps(asdict(corpus)).encode()
            )
            return corpus
        except BaseException:
            handle.close()
            partial.unlink(missing_ok=True)
            raise

    def unlist(self, corpus_id: str) -> bool:
        """The first half of a delete, quick enough for the event loop: remove the metadata,
        so that the corpus is no longer listed nor accepted by a new search, even if the
        rest (remove_text) is interrupted (the restart's cleanup then removes the text)."""
        meta = self.root / f"{corpus_id}.json"
        if not CORPUS_ID.match(corpus_id) or not meta.exists():
            return False
        meta.unlink(missing_ok=True)
        return True

    def remove_text(self, corpus_id: str) -> None:
        """The second half of a delete: the text, on disk and in device memory."""
        self.text_path(corpus_id).unlink(missing_ok=True)
        RESIDENT.evict_matching(lambda key: key[0] == corpus_id)


def _flush(handle: BinaryIO) -> None:
    os.fsync(handle.fileno())


def _fsync_directory(path: Path) -> None:
    """Make the renames inside `path` durable (a crash could otherwise keep one rename of
    a corpus and lose the other, and the restart's cleanup would drop the corpus)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    partial.rename(path)
    _fsync_directory(path.parent)


def corpora_dir(data_dir: Path) -> Path:
    """Where the corpora of a data directory live."""
    return Path(data_dir) / "corpora"


def _text_file(root: Path, corpus_id: str) -> Path:
    return Path(root) / f"{corpus_id}.bin"


def corpus_text(data_dir: Path, corpus_id: str) -> Path:
    """The text file of a corpus in the data directory (for jobs, which run without the app)."""
    return _text_file(corpora_dir(data_dir), corpus_id)


# --------------------------------------------------------------------- routes --

_ERRORS = error_responses(
    {
        401: "no or wrong Bearer token",
        404: "no such corpus",
        422: INVALID_PARAMETER,
        503: "PENCIL_ADMIN_TOKEN is not set: corpora are disabled",
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
        "400": {"description": "empty body", "content": {"application/json": {"schema": ERROR_SCHEMA}}},
        "413": {
            "description": "larger than PENCIL_MAX_CORPUS_BYTES",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        },
        "415": {
            "description": "a multipart form instead of the raw text",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        },
    },
}


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
    RESIDENT.configure(settings.search_resident_fraction)
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
        limit = request.app.state.settings.max_corpus_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        try:
            corpus = await _store(request).create(name, request.stream(), limit)
        except CorpusTooLarge:
            raise _too_large(limit) from None
        log.info("stored corpus %s (%s, %d bytes)", corpus.id, corpus.name, corpus.bytes)
        return JSONResponse(corpus.body(), status_code=201, headers={"Location": f"/corpora/{corpus.id}"})

    @router.get("", summary="List corpora, newest first")
    async def list_corpora(request: Request) -> dict[str, Any]:
        corpora = await asyncio.to_thread(_store(request).list)
        return {"corpora": [c.body() for c in corpora], "total_bytes": sum(c.bytes for c in corpora)}

    @router.get(
        "/{corpus_id}",
        summary="One corpus",
        responses={200: {"content": {"application/json": {"schema": CORPUS_SCHEMA}}}},
    )
    async def get_corpus(request: Request, corpus_id: str) -> dict[str, Any]:
        return _found(request, corpus_id).body()

    @router.delete(
        "/{corpus_id}",
        summary="Delete a corpus (not while a queued or running search uses it)",
        responses=error_responses({409: "a search job uses it"}),
    )
    async def delete_corpus(request: Request, corpus_id: str) -> dict[str, Any]:
        corpus = _found(request, corpus_id)
        using = _jobs_using(request, corpus_id)
        if using:
            raise ApiError(
                409,
                "corpus_in_use",
                (
                    f"search job(s) {', '.join(using[:5])}{' and more' if len(using) > 5 else ''} use corpus "
                    f"{corpus_id}; cancel them or wait, then delete"
                ),
            )
        body = corpus.body()
        # No await between the check above and the unlisting: a search submitted meanwhile
        # either came first (409 above) or finds no corpus (404), never one being deleted.
        _store(request).unlist(corpus_id)
        await asyncio.to_thread(_store(request).remove_text, corpus_id)
        return {**body, "deleted": True, "resident_on": []}

    app.include_router(router)
