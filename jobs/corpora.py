"""Corpora on disk: large texts stored once and searched many times by search jobs, beside
the job store under PENCIL_DATA_DIR (app/corpora.py serves them):

    <data_dir>/corpora/<id>.bin      the text, byte for byte
    <data_dir>/corpora/<id>.json     its metadata: id, name, bytes, sha256, newlines, created,
                                     and the Idempotency-Key's sha256 with the request's digest

A text is received in the chunks the server gets and written in blocks of at most
FLUSH_BYTES on a worker thread (hashing and counting newlines on the way): the server
never holds more than one block of it. It goes to a hidden partial file, is flushed to
disk, then renamed; the metadata file is written (atomically) last, so a corpus that is
listed is complete, and a restart keeps every listed corpus. A cut upload's partial file is
removed when the upload ends; one whose server process died (nothing ran to remove it) is
removed by the next start's cleanup, at once: its writer held a lock on it, which the kernel
freed with the process (an upload in progress in another process keeps its lock, and its file).
The directory is synced after each rename, so a stored corpus survives a power cut.

Idempotency-Key: a key stored before with the same name and text gives back that corpus
and stores nothing; with another name or text, CorpusConflict. The key is kept, hashed,
in the metadata (no database): the lookup reads the listed corpora, under a lock file so
that two requests with one key store one corpus. A storage error is a StorageError
(jobs/storage.py), and leaves no partial file nor a text without its metadata.
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
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from jobs.storage import (
    StorageError,
    create_owned,
    creating_owned,
    exclusive_lock,
    fsync_directory,
    has_owner,
    remove_quietly,
    storage_errors,
    sweeping_owned,
    write_atomically,
)

log = logging.getLogger("pencil.corpora")

FLUSH_BYTES = 8 * 1024 * 1024  # body bytes held before they are written out
MAX_NAME = 200
CORPUS_ID = re.compile(r"^[0-9a-f]{32}$")
UPLOAD_PARTIAL = re.compile(r"^\.[0-9a-f]{32}\.partial$")  # an upload being received (owned by its writer)


@dataclass(frozen=True)
class Corpus:
    id: str
    name: str | None
    bytes: int
    sha256: str
    newlines: int
    created: float
    idempotency_key: str | None = None  # the sha256 of the Idempotency-Key it was stored with
    request_digest: str | None = None  # identifies the request for that key: name and text

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the text in device memory (gpu.search.residency)."""
        return (self.id, self.sha256)

    def body(self, resident_on: list[int]) -> dict[str, Any]:
        """The corpus as the API shows it; `resident_on`: the devices holding its text."""
        out = asdict(self)
        del out["idempotency_key"], out["request_digest"]
        out["created"] = datetime.fromtimestamp(self.created, UTC).isoformat(timespec="milliseconds")
        out["resident_on"] = resident_on
        out["url"] = f"/corpora/{self.id}"
        return out


class CorpusTooLarge(Exception):
    """The text ran past the store's limit."""


class EmptyCorpus(Exception):
    """The text is empty: nothing to store."""


class CorpusConflict(Exception):
    """The Idempotency-Key was used before for another name or text (the earlier corpus)."""

    def __init__(self, corpus: Corpus):
        super().__init__(corpus.id)
        self.corpus = corpus


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
        """Remove what an interrupted upload or delete left: an upload's partial file whose
        writer is gone (it held the file's lock: a process killed mid-upload), at once; other
        partial files, texts without metadata (written last) and metadata without a text once
        unchanged for STALE_AFTER_S (another server process may be writing the newer ones)."""
        try:
            if not self.root.is_dir():
                return
            with sweeping_owned(self.root):
                for path in list(self.root.iterdir()):
                    if not has_owner(path) if UPLOAD_PARTIAL.match(path.name) else _stale(path):
                        log.info("removing %s, left by an interrupted upload or delete", path.name)
                        remove_quietly(path)
        except OSError as exc:  # the requests that need the corpora will say so
            log.warning("could not look for debris in %s: %s", self.root, exc)

    def text_path(self, corpus_id: str) -> Path:
        return _text_file(self.root, corpus_id)

    def get(self, corpus_id: str) -> Corpus | None:
        """The corpus, or None (no such corpus, or unreadable metadata); StorageError when
        the metadata cannot be read."""
        if not CORPUS_ID.match(corpus_id):
            return None
        try:
            text = (self.root / f"{corpus_id}.json").read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError("read the corpus metadata", exc) from exc
        try:
            return Corpus(**json.loads(text))
        except (ValueError, TypeError):
            return None

    def list(self) -> list[Corpus]:
        """Every corpus, newest first."""
        with storage_errors("list the corpora"):
            if not self.root.is_dir():
                return []
            found = [self.get(path.stem) for path in self.root.glob("*.json")]
        return sorted((c for c in found if c is not None), key=lambda c: (c.created, c.id), reverse=True)

    async def create(
        self, name: str | None, chunks: AsyncIterator[bytes], limit: int, key: str | None = None
    ) -> tuple[Corpus, bool]:
        """Store the text arriving in `chunks`. Returns (corpus, created): with an
        Idempotency-Key `key` seen before for the same name and text, the earlier corpus and
        False; for another, raises CorpusConflict. Raises CorpusTooLarge past `limit` bytes,
        EmptyCorpus for an empty body and StorageError when it cannot be written; nothing is
        left behind on any error."""
        corpus_id = uuid.uuid4().hex
        partial = self.root / f".{corpus_id}.partial"
        handle: BinaryIO | None = None
        try:
            with storage_errors("store the corpus"):
                handle = await asyncio.to_thread(self._create_partial, partial)
                size, sha256, newlines = await self._receive(handle, chunks, limit)
                corpus = Corpus(
                    corpus_id,
                    name,
                    size,
                    sha256,
                    newlines,
                    time.time(),
                    hashlib.sha256(key.encode()).hexdigest() if key is not None else None,
                    hashlib.sha256(json.dumps([name, sha256]).encode()).hexdigest(),
                )
                return await asyncio.to_thread(self._keep, partial, corpus)
        finally:
            remove_quietly(partial)  # renamed away when kept; a cut upload's, here and now
            if handle is not None:
                handle.close()  # the owner's lock goes last: a sweep never takes a live partial

    def _create_partial(self, partial: Path) -> BinaryIO:
        """The upload's partial file, owned (jobs/storage.py: create_owned) until it is closed:
        a restart's cleanup removes it once its writer is gone, and only then."""
        self.root.mkdir(parents=True, exist_ok=True)
        with creating_owned(self.root):
            return os.fdopen(create_owned(partial), "wb", buffering=0)  # unbuffered: blocks go straight to it

    async def _receive(self, handle: BinaryIO, chunks: AsyncIterator[bytes], limit: int) -> tuple[int, str, int]:
        """Write the body to `handle` in blocks of at most FLUSH_BYTES, hashing and counting
        newlines on the way, and flush it to disk (the caller closes it). Returns (bytes,
        sha256, newlines)."""
        digest = hashlib.sha256()
        size = newlines = 0

        def write(block: bytes) -> int:
            view = memoryview(block)
            while view:
                view = view[handle.write(view) :]
            digest.update(block)
            return block.count(b"\n")

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
            raise EmptyCorpus()
        await asyncio.to_thread(os.fsync, handle.fileno())
        return size, digest.hexdigest(), newlines

    def _keep(self, partial: Path, corpus: Corpus) -> tuple[Corpus, bool]:
        """Rename the received text into place and write its metadata (atomically, last),
        unless the corpus's Idempotency-Key names an earlier corpus: then that one, or
        CorpusConflict. With a key, under the directory's lock (see the module docstring)."""
        keyed = corpus.idempotency_key is not None
        with exclusive_lock(self.root / ".idempotency.lock") if keyed else nullcontext():
            earlier = self._by_key(corpus.idempotency_key) if keyed else None
            if earlier is not None:
                if earlier.request_digest != corpus.request_digest:
                    raise CorpusConflict(earlier)
                return earlier, False
            text = self.text_path(corpus.id)
            os.rename(partial, text)
            try:
                fsync_directory(self.root)
                write_atomically(self.root / f"{corpus.id}.json", json.dumps(asdict(corpus)).encode())
            except BaseException:
                remove_quietly(text)
                raise
            return corpus, True

    def _by_key(self, key_hash: str | None) -> Corpus | None:
        """The listed corpus stored with this Idempotency-Key hash, if any."""
        return next((c for c in self.list() if c.idempotency_key == key_hash), None)

    def unlist(self, corpus_id: str) -> bool:
        """The first half of a delete, quick enough for the event loop: remove the metadata,
        so that the corpus is no longer listed nor accepted by a new search, even if the
        rest (remove_text) is interrupted (the restart's cleanup then removes the text)."""
        meta = self.root / f"{corpus_id}.json"
        if not CORPUS_ID.match(corpus_id):
            return False
        try:
            meta.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StorageError("delete the corpus", exc) from exc
        return True

    def remove_text(self, corpus_id: str) -> None:
        """The second half of a delete: the text on disk."""
        with storage_errors("delete the corpus text"):
            self.text_path(corpus_id).unlink(missing_ok=True)


def _stale(path: Path) -> bool:
    """Whether `path` is debris of an interrupted upload or delete: a partial file, a text
    without metadata (written last) or metadata without a text, untouched for STALE_AFTER_S
    (another server process may be writing a newer one right now)."""
    if not _untouched_for(path, STALE_AFTER_S):
        return False
    if path.name.startswith(".") and path.name.endswith(".partial"):
        return True
    if path.suffix in (".bin", ".json") and CORPUS_ID.match(path.stem):
        return not path.with_suffix(".json" if path.suffix == ".bin" else ".bin").exists()
    return False


def corpora_dir(data_dir: Path) -> Path:
    """Where the corpora of a data directory live."""
    return Path(data_dir) / "corpora"


def _text_file(root: Path, corpus_id: str) -> Path:
    return Path(root) / f"{corpus_id}.bin"


def corpus_text(data_dir: Path, corpus_id: str) -> Path:
    """The text file of a corpus in the data directory (for jobs, which run without the app)."""
    return _text_file(corpora_dir(data_dir), corpus_id)
