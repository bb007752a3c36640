"""The job store: the jobs' rows in a database, and a directory per job beside it for
the job's input and result files and a copy of its record.

    <data_dir>/jobs/<id>/input/...        stored before the 202 answers the submission
    <data_dir>/jobs/<id>/job.json         the job's record as of its last change that matters
    <data_dir>/jobs/<id>/result-<n>/...   written by the n-th run (attempt) of the job; the
                                          row's `attempt` says which one is the result

The database is SQLite in the data directory (jobs/sqlite.py, one host: the embedded
default) or PostgreSQL when PENCIL_DATABASE_URL is set (jobs/postgres.py: replicas on
many hosts share it and the data directory, which must then be shared storage).

Every state change is one transaction, so a crash leaves each job in a state it really
had. A runner claims a job with a lease (`lease_until`, renewed while it runs) and a
fencing token (`attempt`, raised by each claim): its progress, renewals and end state are
recorded only while the row still holds its attempt and is running, so a runner presumed
dead that wakes up late has its writes refused, and its result folder (named by its
attempt) is never the one the API serves. Jobs whose lease ended go back to the queue
(`requeue_expired`, called by every replica's runner); with SQLite the start-up of the
process that runs the jobs also re-queues every job left running (`recover`).

A job's folder is written under a hidden staging name (inputs and job.json flushed to
disk), renamed into place, and only then is the row inserted: a job in the table always
has its inputs, and a failed submission leaves nothing. job.json is rewritten atomically
when the job is created, succeeds, fails or is canceled (progress is not mirrored), so
the folders are enough to rebuild a lost SQLite table: opening an SQLite store whose
table has no jobs while job folders exist restores them (a job that was running comes
back queued), with a WARNING line saying how many; folders without a readable job.json
are logged and left to the retention sweep, which removes folders that have no row once
they are older than the retention period. The process that runs the jobs also reconciles
folders and rows at its start, both ways (`reconcile`): single rows lost, and rows whose
folder is gone. A submission owns its folder (a lock on its job.json) until its row is in,
so a folder being submitted is never mistaken for one whose row was lost. What cannot be
fixed at start-up (an unwritable data directory, a database that cannot be opened, reached
or written) is a StartupError whose message says what to do.

Runtime database errors are raised as they are (`DATABASE_ERRORS`); the API answers
them 503 database_unavailable (app/errors.py). File-system errors are StorageErrors.
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import math
import os
import re
import socket
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from jobs.sqlite import FILE_NAME, SqliteDatabase
from jobs.storage import (
    SpaceReserve,
    StartupError,
    StorageError,
    create_owned,
    creating_owned,
    exclusive_lock,
    fsync_directory,
    has_owner,
    out_of_space,
    prepare_directory,
    remove_tree_quietly,
    storage_errors,
    sweeping_owned,
    write_atomically,
    write_file,
)

log = logging.getLogger("pencil.jobs")
Result = TypeVar("Result")

STATUSES = ("queued", "running", "succeeded", "failed", "canceled")
FINISHED = ("succeeded", "failed", "canceled")
RECORD = "job.json"
RESERVE = "space-reserve"  # jobs/storage.py SpaceReserve: room to record a job's end on a full disk
OPEN_LOCK = "job-store.lock"  # one server process at a time checks, repairs and rebuilds an SQLite database
JOB_ID = re.compile(r"[0-9a-f]{32}")
RESULT_FOLDER = re.compile(r"result(-[0-9]+)?")
NAME_MAX = 255  # bytes in one file name
DEFAULT_LEASE_S = 30.0
# The readiness probe's longest wait for the database: well under a probe's own timeout
# (deploy/kubernetes: 3 s), so an outage reads as 503 rather than as a probe that timed out.
PROBE_WAIT_S = 0.5
CANCELED_WHILE_RUNNING = "canceled while running"  # the error of a running job that stopped after a cancel


@dataclass(frozen=True)
class Job:
    """One row of the store. Times are Unix seconds; params and result are JSON values.
    `attempt` counts the runs started (the fencing token of the latest); `replica` names
    the replica that runs or last ran it."""

    id: str
    kind: str
    status: str
    params: dict[str, Any]
    created: float
    started: float | None
    finished: float | None
    progress: float
    error: str | None
    result: dict[str, Any] | None
    cancel_requested: bool
    idempotency_key: str | None
    request_digest: str | None
    request_id: str | None = None  # X-Request-ID of the submission, for the job's log lines
    attempt: int = 0
    replica: str | None = None

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED


# The job table's columns are Job's fields, in the order of the schema (jobs/sqlite.py,
# jobs/postgres.py), which also has `lease_until`, the store's alone. The fields whose row
# value differs from the Job's: field -> (to the row, from the row); the others are stored as they are.
_COLUMNS = tuple(field.name for field in fields(Job))
_CONVERTED: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "params": (json.dumps, json.loads),  # JSON text
    "result": (  # JSON text, or NULL
        lambda value: json.dumps(value) if value is not None else None,
        lambda text: json.loads(text) if text else None,
    ),
    "cancel_requested": (int, bool),  # an INTEGER column
}
_INSERT = f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"


class Claim(enum.Enum):
    """The state of a runner's claim on a job, as it learns when it reports progress or renews its lease."""

    HELD = "held"  # carry on
    CANCEL = "cancel"  # a cancel was asked for: stop at this checkpoint
    LOST = "lost"  # the lease ended: the job went back to the queue or another replica runs it; write nothing


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before for a different request."""

    def __init__(self, job: Job):
        super().__init__(job.id)
        self.job = job


class Session(Protocol):
    """Statements in one transaction of a job database (`?` placeholders)."""

    def one(self, sql: str, args: Sequence[Any] = ()) -> Mapping[str, Any] | None: ...
    def all(self, sql: str, args: Sequence[Any] = ()) -> Sequence[Mapping[str, Any]]: ...
    def run(self, sql: str, args: Sequence[Any] = ()) -> int: ...
    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


class Database(Protocol):
    """What the store needs of a job database (SqliteDatabase, PostgresDatabase)."""

    name: str
    NOW: str  # SQL: the database's time in Unix seconds
    SKIP_LOCKED: str  # SQL appended to a claiming SELECT
    errors: tuple[type[Exception], ...]
    integrity_errors: tuple[type[Exception], ...]

    def session(self, write: bool = False, wait_s: float | None = None) -> AbstractContextManager[Session]:
        """`wait_s`: the longest wait for a connection (None: the database's own limit)."""
        ...

    def verify(self) -> None:
        """A database error when the database in use is not the configured one any more."""
        ...

    def close(self) -> None: ...


def _database_errors() -> tuple[type[Exception], ...]:
    try:
        import psycopg
    except ImportError:
        return (sqlite3.Error,)
    return (sqlite3.Error, psycopg.Error)


DATABASE_ERRORS = _database_errors()
"""The exceptions a job database raises: sqlite3's, and psycopg's where it is installed."""


class JobStore:
    def __init__(
        self,
        data_dir: Path,
        database_url: str | None = None,
        replica: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
    ):
        """Open the store of `data_dir` and its database: PostgreSQL at `database_url`, else
        SQLite in `data_dir` (checked and repaired as the module docstring says).
        `replica`: this replica's name in the rows it claims (default: the host name).
        `lease_s`: how long a claim holds without a renewal. StartupError when the store
        cannot be used."""
        self.data_dir = Path(data_dir)
        self.jobs_dir = self.data_dir / "jobs"
        self.replica = replica or socket.gethostname()
        self.lease_s = float(lease_s)
        self._record_lock = threading.Lock()
        self._last_error: tuple[float, str] | None = None  # (time.monotonic(), message) of the last database error
        prepare_directory(self.data_dir)
        prepare_directory(self.jobs_dir)
        self._reserve = SpaceReserve(self.data_dir / RESERVE)  # see _finish
        self._reserve.keep()
        self._db: Database = _open_postgres(database_url) if database_url else self._open_sqlite()

    @property
    def shared(self) -> bool:
        """Whether replicas on other hosts may share this store (PostgreSQL): their running
        jobs are theirs until their leases end, never re-queued at this one's start."""
        return not isinstance(self._db, SqliteDatabase)

    @property
    def database(self) -> str:
        """Which database, for logs and /healthz: "SQLite" or "PostgreSQL"."""
        return self._db.name

    def _open_sqlite(self) -> SqliteDatabase:
        try:
            with exclusive_lock(self.data_dir / OPEN_LOCK):
                db = SqliteDatabase(self.data_dir)
                try:
                    self._db = db
                    self._restore_if_empty()
                except BaseException:
                    db.close()
                    raise
                return db
        except (OSError, sqlite3.Error) as exc:
            raise StartupError(
                f"the job database {self.data_dir / FILE_NAME} cannot be used ({exc}): check that "
                "PENCIL_DATA_DIR is a writable local directory with free space, then restart"
            ) from exc

    @contextmanager
    def _session(self, write: bool = False, wait_s: float | None = None) -> Iterator[Session]:
        """A session of the database; a database error (not a constraint) is remembered
        for `recent_error`, then raised."""
        try:
            with self._db.session(write, wait_s) as session:
                yield session
        except self._db.integrity_errors:
            raise
        except self._db.errors as exc:
            self._last_error = (time.monotonic(), str(exc).strip() or type(exc).__name__)
            raise

    def session(self, write: bool = False) -> AbstractContextManager[Session]:
        """A session of the store's database, for the job system's other tables (webhooks)."""
        return self._session(write)

    @property
    def dialect(self) -> Database:
        """The database's SQL differences (NOW, SKIP_LOCKED) and its error types."""
        return self._db

    def recent_error(self, within_s: float) -> str | None:
        """The last database error of any use of the store (requests, runner, metrics) if it
        happened within the last `within_s` seconds, else None."""
        last = self._last_error
        return last[1] if last is not None and time.monotonic() - last[0] <= within_s else None

    def close(self) -> None:
        self._db.close()

    def _restore_if_empty(self) -> None:
        """A table without jobs while job folders exist (a database deleted, emptied or moved
        aside): insert the jobs their job.json files describe."""
        with self._session() as db:
            if db.one("SELECT 1 FROM jobs LIMIT 1") is not None:
                return
        folders = self._job_folders()
        if not folders:
            return
        restored = self._restore(folders)
        log.warning(
            "the job database %s had no jobs: restored %d job(s) from the job.json files in %s",
            self._db,
            len(restored),
            self.jobs_dir,
        )

    def reconcile(self, retention_s: float) -> None:
        """At the start of the process that runs the jobs (one per replica), bring the job
        folders and the rows back in line, both ways, each change logged:

        - a folder whose job.json describes a job the table lacks (a row lost with a corrupted
          WAL tail, say) gets its row back, as `_restore_if_empty` does for a whole table: a
          job that was running comes back queued. Not a folder a live submission owns (its row
          is being inserted), nor a job that finished before the retention period (purged:
          its folder is next).
        - a queued or running job whose folder is gone cannot run (its inputs are lost): it
          fails, saying so. A finished job without its folder keeps its row, the record, and
          is logged: its result files are gone. When no job folder is left at all while the
          table holds jobs, nothing is changed and an ERROR says so: that looks like a data
          directory that is not the one of this database (a shared one not mounted), not like
          lost jobs.
        - the staging folders of submissions whose process died are removed (`_purge_partials`).

        Safe when several replicas of a shared store start at once: rows are inserted with ON
        CONFLICT DO NOTHING, a job fails only while it is still queued or running, and the
        rows are read before the folders are listed (a job's folder exists before its row)."""
        with self._session() as db:
            rows = {row["id"]: row["status"] for row in db.all("SELECT id, status FROM jobs")}
        folders = {folder.name: folder for folder in self._job_folders()}
        restored = self._restore([folder for job_id, folder in folders.items() if job_id not in rows], retention_s)
        if restored:
            log.warning(
                "%d job folder(s) in %s had no row in the job database %s: restored from their job.json (%s)",
                len(restored),
                self.jobs_dir,
                self._db,
                _some(restored),
            )
        without = [job_id for job_id in rows if job_id not in folders and not (self.jobs_dir / job_id).exists()]
        if without and not folders:
            log.error(
                "the job database %s holds %d job(s) but %s has no job folder at all: is PENCIL_DATA_DIR the "
                "directory of this database (a shared one mounted)? Nothing was changed",
                self._db,
                len(rows),
                self.jobs_dir,
            )
        elif without:
            self._fail_without_folder([job_id for job_id in without if rows[job_id] not in FINISHED])
            finished = [job_id for job_id in without if rows[job_id] in FINISHED]
            if finished:
                log.warning(
                    "%d finished job(s) have no folder in %s: their result files are gone, their records stay (%s)",
                    len(finished),
                    self.jobs_dir,
                    _some(finished),
                )
        partials = self._purge_partials()
        if partials:
            log.warning("removed %d staging folder(s) of submissions cut off by a stopped process", partials)

    def _fail_without_folder(self, job_ids: list[str]) -> None:
        """Fail the queued or running jobs `job_ids`, whose folders are gone."""
        failed = []
        for job_id in job_ids:
            error = f"the job's folder {self.jobs_dir / job_id} (its input files and record) is missing"
            with self._session(write=True) as db:
                if db.run(
                    "UPDATE jobs SET status = 'failed', finished = ?, error = ?, lease_until = NULL "
                    "WHERE id = ? AND status IN ('queued', 'running')",
                    (time.time(), error, job_id),
                ):
                    failed.append(job_id)
        if failed:
            log.warning(
                "%d queued or running job(s) have no folder in %s, so their inputs are lost: failed (%s)",
                len(failed),
                self.jobs_dir,
                _some(failed),
            )

    def _restore(self, folders: list[Path], retention_s: float | None = None) -> list[str]:
        """Insert the jobs the job.json files of `folders` describe, unless a submission in
        progress owns the folder or (with `retention_s`) the job finished before the retention
        period; running jobs come back queued. Folders without a readable job.json are
        logged. Returns the ids inserted."""
        cutoff = time.time() - retention_s if retention_s is not None else None
        jobs, unreadable = [], []
        with sweeping_owned(self.jobs_dir):  # no submission creates its owner meanwhile
            owned = {folder for folder in folders if has_owner(folder / RECORD)}
        for folder in folders:
            if folder in owned or not folder.is_dir():  # being submitted, or removed meanwhile
                continue
            job = _read_record(folder)
            if job is None:
                unreadable.append(folder.name)
            elif cutoff is None or job.finished is None or job.finished >= cutoff:
                jobs.append(_restored(job))
        inserted: list[str] = []
        if jobs:
            with self._session(write=True) as db:
                for job in jobs:
                    if db.run(_INSERT + " ON CONFLICT DO NOTHING", _row(job)):
                        inserted.append(job.id)
        if unreadable:
            log.warning(
                "%d job folder(s) in %s have no readable job.json (%s), so their jobs are lost; they are removed "
                "once older than PENCIL_JOB_RETENTION_DAYS",
                len(unreadable),
                self.jobs_dir,
                _some(sorted(unreadable)),
            )
        return inserted

    def _job_folders(self) -> list[Path]:
        if not self.jobs_dir.is_dir():
            return []
        return [path for path in self.jobs_dir.iterdir() if JOB_ID.fullmatch(path.name) and path.is_dir()]

    # ---------------------------------------------------------------- files --

    def input_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id / "input"

    def result_dir(self, job: Job) -> Path:
        """The result folder of the job's current attempt (`result` for jobs run before
        attempts were counted)."""
        return self.jobs_dir / job.id / _result_folder(job.attempt)

    def result_file(self, job: Job, name: str) -> tuple[Path, os.stat_result] | None:
        """The result file `name` of a job and what lstat said of it (the response serves
        that length and date), or None: a name that cannot be a result file (empty, hidden,
        a path, longer than NAME_MAX bytes), no such file, a symbolic link or anything but
        a regular file, or a result folder that is not the job's own (reached by a link)."""
        if not _is_file_name(name):
            return None
        folder = self.result_dir(job)
        if os.path.realpath(folder) != os.path.join(os.path.realpath(self.jobs_dir), job.id, folder.name):
            return None
        try:
            status = os.lstat(folder / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno in (errno.ENAMETOOLONG, errno.ELOOP):
                return None
            raise StorageError("read the result file", exc) from exc
        return (folder / name, status) if stat.S_ISREG(status.st_mode) else None

    def result_names(self, job: Job) -> list[str]:
        """The names of a job's result files (regular files only), sorted."""
        folder = self.result_dir(job)
        with storage_errors("list the result files"):
            if not folder.is_dir():
                return []
            with os.scandir(folder) as entries:
                return sorted(e.name for e in entries if _is_file_name(e.name) and e.is_file(follow_symlinks=False))

    def _remove_results(self, job_id: str, keep: Job | None = None) -> None:
        """Remove a job's result folders but that of `keep`'s attempt: what runs cut off by a
        crash or a lost lease left (the API never serves them)."""
        kept = _result_folder(keep.attempt) if keep is not None else None
        try:
            entries = list(os.scandir(self.jobs_dir / job_id))
        except OSError:
            return
        for entry in entries:
            if entry.name != kept and RESULT_FOLDER.fullmatch(entry.name):
                remove_tree_quietly(Path(entry.path))

    # -------------------------------------------------------------- writing --

    def create(
        self,
        kind: str,
        params: Mapping[str, Any],
        inputs: Mapping[str, bytes] | None = None,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        request_id: str | None = None,
        webhook: str | None = None,
    ) -> tuple[Job, bool]:
        """Store a queued job with its input files (its folder first, then the row, so a
        job in the table always has its inputs). Returns (job, created); with an
        Idempotency-Key seen before for the same request digest, the earlier job and
        False; for another digest, raises IdempotencyConflict. `request_id`: the submitting
        request's X-Request-ID, which the runner logs the job with. `webhook`: a URL to
        POST the finished job to (jobs/webhooks.py), stored in the same transaction.
        StorageError when the folder cannot be written (nothing is left of it)."""
        if idempotency_key is not None:
            earlier = self._by_key(idempotency_key)
            if earlier is not None:
                if earlier.request_digest != request_digest:
                    raise IdempotencyConflict(earlier)
                return earlier, False
        job = Job(
            id=uuid.uuid4().hex,
            kind=kind,
            status="queued",
            params=json.loads(json.dumps(dict(params))),
            created=time.time(),
            started=None,
            finished=None,
            progress=0.0,
            error=None,
            result=None,
            cancel_requested=False,
            idempotency_key=idempotency_key,
            request_digest=request_digest,
            request_id=request_id,
        )
        owner = self._store_folder(job, inputs or {})
        try:
            with self._session(write=True) as db:
                db.run(_INSERT, _row(job))
                if webhook is not None:
                    db.run("INSERT INTO webhooks (job_id, url, due) VALUES (?, ?, ?)", (job.id, webhook, job.created))
        except self._db.integrity_errors:
            restored = self.get(job.id)  # another process starting up restored it from its folder
            if restored is not None:
                return restored, True
            remove_tree_quietly(self.jobs_dir / job.id)  # the same key raced us in: answer as for a retry
            return self.create(kind, params, inputs, idempotency_key, request_digest, request_id, webhook)
        except BaseException:
            remove_tree_quietly(self.jobs_dir / job.id)
            raise
        finally:
            os.close(owner)  # the folder has its row, or is gone: reconcile may look at it now
        return job, True  # as inserted: reading the row back gives the same Job

    def _store_folder(self, job: Job, inputs: Mapping[str, bytes]) -> int:
        """The job's folder with its inputs and job.json, written and flushed under a hidden
        staging name, then renamed into place; on a failure nothing is left of it. Returns
        the open job.json, whose lock marks the folder as owned by this submission until the
        caller closes it (jobs/storage.py create_owned): start-up sweeps and `reconcile` leave
        an owned folder alone, and remove or restore one whose submitter died."""
        staging = self.jobs_dir / f".{job.id}.partial"
        folder = self.jobs_dir / job.id
        owner = None
        try:
            with creating_owned(self.jobs_dir):
                staging.mkdir()
                owner = create_owned(staging / RECORD)
            (staging / "input").mkdir()
            for name, data in inputs.items():
                write_file(staging / "input" / name, data)
            record = memoryview(_record(job))
            while record:
                record = record[os.write(owner, record) :]
            os.fsync(owner)
            fsync_directory(staging / "input")
            fsync_directory(staging)
            os.rename(staging, folder)
            fsync_directory(self.jobs_dir)
        except OSError as exc:
            remove_tree_quietly(staging)
            remove_tree_quietly(folder)
            if owner is not None:
                os.close(owner)
            raise StorageError("store the job's input files", exc) from exc
        return owner

    def _write_record(self, job_id: str) -> None:
        """Rewrite the job's job.json from its row. A failure is logged, not raised: the row
        stays the record, the copy only serves a rebuild."""
        with self._record_lock:  # the last writer writes the latest state
            try:
                job = self.get(job_id)
            except self._db.errors as exc:  # the row is stored: only its copy waits for the next change
                log.warning("could not read job %s to update its job.json (%s)", job_id, exc)
                return
            folder = self.jobs_dir / job_id
            if job is None or not folder.is_dir():
                return
            try:
                self._with_reserve(f"update {folder / RECORD}", lambda: write_atomically(folder / RECORD, _record(job)))
            except OSError as exc:
                log.warning("could not update %s (%s); the database keeps the job's state", folder / RECORD, exc)

    def claim_next(self) -> Job | None:
        """The oldest queued job, now running under this replica's lease with its attempt
        counted; None when the queue is empty. Replicas claiming at once get different jobs."""
        with self._session(write=True) as db:
            row = db.one(*self.claim_statement())
        return _job(row) if row else None

    def claim_statement(self) -> tuple[str, tuple[Any, ...]]:
        """The claim's SQL (`?` placeholders) and arguments (bench/job_queue.py times it)."""
        sql = (
            "UPDATE jobs SET status = 'running', started = ?, progress = 0, attempt = attempt + 1, "
            f"replica = ?, lease_until = {self._db.NOW} + ? "
            "WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY created, id LIMIT 1"
            f"{self._db.SKIP_LOCKED}) AND status = 'queued' RETURNING *"
        )
        return sql, (time.time(), self.replica, self.lease_s)

    def renew(self, job: Job) -> Claim:
        """Extend the lease of a job this replica runs (claimed as `job`)."""
        return self._touch(job, "")

    def set_progress(self, job: Job, progress: float) -> Claim:
        """Record progress (0..1) of a job this replica runs, which also renews its lease."""
        return self._touch(job, "progress = ?, ", min(max(progress, 0.0), 1.0))

    def _touch(self, job: Job, assignment: str, *values: Any) -> Claim:
        with self._session(write=True) as db:
            row = db.one(
                f"UPDATE jobs SET {assignment}lease_until = {self._db.NOW} + ? "
                "WHERE id = ? AND attempt = ? AND status = 'running' RETURNING cancel_requested",
                (*values, self.lease_s, job.id, job.attempt),
            )
        if row is None:
            return Claim.LOST
        return Claim.CANCEL if row["cancel_requested"] else Claim.HELD

    def succeed(self, job: Job, result: Mapping[str, Any]) -> bool:
        """Store the result of a job this replica ran (claimed as `job`): JSON, with NaN and
        infinities written as null (JSON has none, and a result the API could not send
        would turn every GET of it into a 500). False when the lease was lost (another
        attempt's result counts, not this one)."""
        return self._finish(job, "succeeded", result=json.dumps(_json_safe(result), allow_nan=False), progress=1.0)

    def fail(self, job: Job, error: str) -> bool:
        return self._finish(job, "failed", error=error)

    def mark_canceled(self, job: Job) -> bool:
        """A running job stopped at a checkpoint after a cancel."""
        return self._finish(job, "canceled", error=CANCELED_WHILE_RUNNING)

    def _finish(
        self,
        job: Job,
        status: str,
        result: str | None = None,
        error: str | None = None,
        progress: float | None = None,
    ) -> bool:
        """The end state of the claim `job`; False (nothing written) when its lease was lost.
        Once it is stored, the result folders of other attempts (all of them unless it
        succeeded) are removed. A full disk (SQLite's row, job.json) gives up the space reserve
        (RESERVE) and tries again: a job whose result hit ENOSPC fails now, saying so, rather
        than showing running until its lease ends and then running again."""

        def update() -> int:
            with self._session(write=True) as db:
                return db.run(
                    "UPDATE jobs SET status = ?, finished = ?, result = ?, error = ?, "
                    "progress = COALESCE(?, progress), lease_until = NULL WHERE id = ? AND attempt = ? "
                    "AND status = 'running'",
                    (status, time.time(), result, error, progress, job.id, job.attempt),
                )

        changed = self._with_reserve(f"record the end of job {job.id}", update)
        if changed:
            self._write_record(job.id)
            self._remove_results(job.id, keep=job if status == "succeeded" else None)
        return bool(changed)

    def _with_reserve(self, action: str, write: Callable[[], Result]) -> Result:
        """`write()`; when it fails for want of space and the space reserve could be given up,
        `write()` once more."""
        failures: tuple[type[Exception], ...] = (OSError, *self._db.errors)
        try:
            return write()
        except failures as exc:
            if not (out_of_space(exc) and self._reserve.release()):
                raise
            log.warning("the disk of %s is full (%s): gave up the space reserve to %s", self.data_dir, exc, action)
            return write()

    def keep_reserve(self) -> None:
        """Make the space reserve again where it was given up and there is room (the runner's
        heartbeat calls it)."""
        self._reserve.keep()

    def cancel(self, job_id: str) -> Job | None:
        """Cancel: a queued job at once, a running one at its next checkpoint (the flag is
        set; its runner finishes it as canceled). Finished jobs are left as they are.
        Returns the job after the change, or None when there is no such job."""
        # One statement: a row re-queued by another replica between two statements would
        # escape both (PostgreSQL re-reads a row changed meanwhile and applies this to it).
        with self._session(write=True) as db:
            row = db.one(
                "UPDATE jobs SET "
                "finished = CASE WHEN status = 'queued' THEN ? ELSE finished END, "
                "error = CASE WHEN status = 'queued' THEN 'canceled before it started' ELSE error END, "
                "cancel_requested = CASE WHEN status = 'running' THEN 1 ELSE cancel_requested END, "
                "status = CASE WHEN status = 'queued' THEN 'canceled' ELSE status END "
                "WHERE id = ? AND status IN ('queued', 'running') RETURNING *",
                (time.time(), job_id),
            )
        if row is None:  # no such job, or it had finished: as it is
            return self.get(job_id)
        # The record is written from the row as it is then: a running job may finish meanwhile.
        self._write_record(job_id)
        return _job(row)  # as the cancel left it

    def recover(self) -> int:
        """At the start of the (one) process that runs an SQLite store's jobs: jobs left
        running by a stopped process go back to the queue (a cancel asked for meanwhile is
        honoured). Returns how many were re-queued."""
        return sum(not job.cancel_requested for job in self._requeue("1 = 1"))

    def requeue_expired(self) -> list[Job]:
        """Running jobs whose lease ended (their replica died, or stalled past its lease)
        go back to the queue, or end canceled when a cancel was asked for. Returns them as
        they were before (their `replica` is the one that lost them)."""
        return self._requeue(f"lease_until < {self._db.NOW}")

    def _requeue(self, condition: str) -> list[Job]:
        lost = f"SELECT * FROM jobs WHERE status = 'running' AND {condition}{self._db.SKIP_LOCKED}"
        with self._session(write=True) as db:
            jobs = [_job(row) for row in db.all(lost)]
            for job in jobs:  # their rows stay as read until the commit (FOR UPDATE; SQLite: one writer)
                after = _restored(job)
                db.run(
                    "UPDATE jobs SET status = ?, started = ?, finished = ?, progress = ?, error = ?, replica = ?, "
                    "lease_until = NULL WHERE id = ?",
                    (after.status, after.started, after.finished, after.progress, after.error, after.replica, job.id),
                )
        for job in jobs:
            if job.cancel_requested:
                self._write_record(job.id)
                self._remove_results(job.id)
        return jobs

    def purge(self, older_than_s: float) -> int:
        """Delete finished jobs (rows and files) that finished more than `older_than_s` ago,
        job folders without a row unchanged for as long, and the staging folders of
        submissions whose server process died."""
        cutoff = time.time() - older_than_s
        with self._session(write=True) as db:
            deleted = db.all("DELETE FROM jobs WHERE finished IS NOT NULL AND finished < ? RETURNING id", (cutoff,))
        ids = [row["id"] for row in deleted]
        for job_id in ids:
            remove_tree_quietly(self.jobs_dir / job_id)
        self._purge_orphans(cutoff)
        self._purge_partials()
        return len(ids)

    def _purge_orphans(self, cutoff: float) -> None:
        """Remove the job folders that have no row and have not changed since `cutoff`:
        jobs a lost database took with it that could not be restored, or an interrupted purge."""
        removed = 0
        for folder in self._job_folders():
            try:
                old = folder.lstat().st_mtime < cutoff
            except FileNotFoundError:
                continue
            if old and self.get(folder.name) is None:
                remove_tree_quietly(folder)
                removed += 1
        if removed:
            log.warning("removed %d job folder(s) of %s that had no job record", removed, self.jobs_dir)

    def _purge_partials(self) -> int:
        """Remove the staging folders of submissions whose server process died before their
        row (their job.json is not owned any more; another process's submission in progress
        keeps its own). Returns how many."""
        removed = 0
        with sweeping_owned(self.jobs_dir):
            for partial in self.jobs_dir.glob(".*.partial"):
                if partial.is_dir() and not has_owner(partial / RECORD):
                    remove_tree_quietly(partial)
                    removed += 1
        return removed

    # -------------------------------------------------------------- reading --

    def get(self, job_id: str) -> Job | None:
        with self._session() as db:
            row = db.one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return _job(row) if row else None

    def _by_key(self, key: str) -> Job | None:
        with self._session() as db:
            row = db.one("SELECT * FROM jobs WHERE idempotency_key = ?", (key,))
        return _job(row) if row else None

    def page(
        self, status: str | None = None, kind: str | None = None, limit: int = 50, after: str | None = None
    ) -> tuple[list[Job], str | None]:
        """Jobs newest first, filtered; `after` is the id of the last job of the previous
        page. Returns (jobs, id to pass as `after` for the next page or None)."""
        where, args = [], []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        if after is not None:
            where.append("(created, id) < (SELECT created, id FROM jobs WHERE id = ?)")
            args.append(after)
        sql = (
            "SELECT * FROM jobs"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY created DESC, id DESC LIMIT ?"
        )
        with self._session() as db:
            rows = db.all(sql, (*args, limit + 1))
        jobs = [_job(row) for row in rows[:limit]]
        return jobs, (jobs[-1].id if len(rows) > limit else None)

    def counts(self) -> dict[tuple[str, str], int]:
        """(kind, status) -> number of jobs, for the metrics."""
        with self._session() as db:
            rows = db.all("SELECT kind, status, COUNT(*) AS n FROM jobs GROUP BY kind, status")
        return {(row["kind"], row["status"]): row["n"] for row in rows}

    def probe(self) -> None:
        """Raise a database error unless the database is still the configured one (SQLite: the
        file it opened is still at its path) and can be written and its job table read:
        a one-row write transaction on `health` and the scan of the table the metrics make
        (the table holds the jobs of the retention period: cheap enough for every readiness
        probe). Corruption elsewhere shows in the queries that meet it (recent_error). It
        waits at most PROBE_WAIT_S for a connection, so that a readiness probe reads 503 during
        an outage rather than timing out."""
        with self._session(write=True, wait_s=PROBE_WAIT_S) as db:
            self._db.verify()
            db.run(
                "INSERT INTO health (id, checked) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET checked = excluded.checked",
                (time.time(),),
            )
            db.all("SELECT kind, status, COUNT(*) FROM jobs GROUP BY kind, status")


def _open_postgres(url: str) -> Database:
    """The PostgreSQL database at `url`, migrated; StartupError saying what to do when the
    driver is missing or the server cannot be used."""
    try:
        import psycopg

        from jobs.postgres import PostgresDatabase
    except ImportError as exc:
        raise StartupError(
            f"PENCIL_DATABASE_URL is set but the PostgreSQL driver is missing ({exc}): "
            "pip install 'pencil-gpu[postgres]', or unset it to keep the jobs in SQLite"
        ) from exc
    try:
        return PostgresDatabase(url)
    except (psycopg.Error, OSError) as exc:
        from jobs.postgres import shown_url

        raise StartupError(
            f"the job database {shown_url(url)} cannot be used ({str(exc).strip()}): check "
            "PENCIL_DATABASE_URL, that the server is up and that its user may create tables, then restart"
        ) from exc


def _some(names: Sequence[str], shown: int = 3) -> str:
    """The first `shown` of `names`, for a log line."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def _result_folder(attempt: int) -> str:
    return f"result-{attempt}" if attempt > 0 else "result"


# ------------------------------------------------------------------ rows --


def _row(job: Job) -> tuple[Any, ...]:
    """The values of _INSERT for `job`."""
    values: list[Any] = []
    for name in _COLUMNS:
        value = getattr(job, name)
        values.append(_CONVERTED[name][0](value) if name in _CONVERTED else value)
    return tuple(values)


def _job(row: Mapping[str, Any]) -> Job:
    """The Job of a row of the table (its other columns, such as lease_until, are left out)."""
    values: dict[str, Any] = {}
    for name in _COLUMNS:
        value = row[name]
        values[name] = _CONVERTED[name][1](value) if name in _CONVERTED else value
    return Job(**values)


# -------------------------------------------------------------- job records --


def _record(job: Job) -> bytes:
    """The job.json of `job`."""
    return json.dumps({"version": 1, **asdict(job)}, indent=1).encode()


def _read_record(folder: Path) -> Job | None:
    """The job a folder's job.json describes, or None when it is missing or unreadable."""
    try:
        stored = json.loads((folder / RECORD).read_bytes())
        job = Job(**{f.name: stored[f.name] for f in fields(Job) if f.name in stored})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    valid = (
        job.id == folder.name
        and isinstance(job.kind, str)
        and job.status in STATUSES
        and isinstance(job.params, dict)
        and isinstance(job.created, (int, float))
    )
    return job if valid else None


def _restored(job: Job) -> Job:
    """A job as it comes back when its run was lost (its process stopped, its lease ended,
    or its database was rebuilt from its record): one that was running is queued again (or
    canceled, when a cancel was asked for). `JobStore._requeue` writes this to the rows of
    `recover` and `requeue_expired`; `_restore_if_empty` inserts it from job.json."""
    if job.status != "running":
        return job
    if job.cancel_requested:
        return replace(job, status="canceled", finished=time.time(), error=CANCELED_WHILE_RUNNING)
    return replace(job, status="queued", started=None, progress=0.0, replica=None)


def _is_file_name(name: str) -> bool:
    """Whether `name` can be a result file's name: one visible path component of at most
    NAME_MAX bytes."""
    try:
        encoded = os.fsencode(name)
    except UnicodeEncodeError:
        return False
    return 0 < len(encoded) <= NAME_MAX and not name.startswith(".") and "/" not in name and "\0" not in name


def _json_safe(value: Any) -> Any:
    """`value` with every float that is NaN or infinite replaced by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def job_body(job: Job) -> dict[str, Any]:
    """A job as the API shows it (GET /jobs/{id}, the events and the webhooks send it):
    times as ISO 8601 UTC, the URL of its result once it has succeeded."""
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


def _iso(t: float | None) -> str | None:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds") if t is not None else None
