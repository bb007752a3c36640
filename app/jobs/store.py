"""The job store: one SQLite database (WAL) under PENCIL_DATA_DIR, and a directory per job
beside it for the job's input and result files and a copy of its record.

    <data_dir>/jobs.sqlite3
    <data_dir>/jobs/<id>/input/...     stored before the 202 answers the submission
    <data_dir>/jobs/<id>/job.json      the job's record as of its last change that matters
    <data_dir>/jobs/<id>/result/...    written by the runner, then the row says succeeded

Every state change is one transaction, so a crash leaves each job in a state it really
had; at start-up `recover()` puts the jobs that were running back in the queue. A lock
serialises the process's use of its one connection (the runner's threads and the event
loop share it; the statements are short).

A job's folder is written under a hidden staging name (inputs and job.json flushed to
disk), renamed into place, and only then is the row inserted: a job in the table always has
its inputs, and a failed submission leaves nothing. job.json is rewritten atomically when
the job is created, succeeds, fails or is canceled (progress is not mirrored), so the
folders are enough to rebuild the table.

Opening the store checks the database with PRAGMA quick_check, one server process at a
time (a lock file in the data directory):

- a corrupt database (or a file that is no database) is moved aside as
  `jobs.sqlite3.corrupt-<UTC time>` with its -wal and -shm, one ERROR line saying where,
  and a new one is made;
- a database with no jobs (new, deleted, emptied or moved aside) while job folders exist is
  rebuilt from their job.json files (a job that was running comes back queued), with a
  WARNING line saying how many; folders without a readable job.json (made before the
  record was mirrored) are logged and left to the retention sweep, which removes folders
  that have no row once they are older than the retention period;
- what cannot be fixed (an unwritable data directory, a database that cannot be opened or
  written) is a StartupError whose message says what to do.

Runtime database errors are raised as they are (sqlite3.DatabaseError); the API answers
them 503 database_unavailable (app/errors.py). File-system errors are StorageErrors.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from app.storage import (
    StartupError,
    StorageError,
    exclusive_lock,
    fsync_directory,
    prepare_directory,
    remove_tree_quietly,
    storage_errors,
    write_atomically,
    write_file,
)

log = logging.getLogger("pencil.jobs")

STATUSES = ("queued", "running", "succeeded", "failed", "canceled")
FINISHED = ("succeeded", "failed", "canceled")
DATABASE = "jobs.sqlite3"
RECORD = "job.json"
OPEN_LOCK = "job-store.lock"  # one server process at a time checks, repairs and rebuilds the database
JOB_ID = re.compile(r"[0-9a-f]{32}")
NAME_MAX = 255  # bytes in one file name
SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    params TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    progress REAL NOT NULL DEFAULT 0,
    error TEXT,
    result TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    idempotency_key TEXT UNIQUE,
    request_digest TEXT,
    request_id TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, created);
CREATE INDEX IF NOT EXISTS jobs_by_created ON jobs (created, id);
CREATE TABLE IF NOT EXISTS health (id INTEGER PRIMARY KEY, checked REAL NOT NULL);
"""
_COLUMNS = (
    "id, kind, status, params, created, started, finished, progress, error, result, cancel_requested, "
    "idempotency_key, request_digest, request_id"
)
_INSERT = f"INSERT INTO jobs ({_COLUMNS}) VALUES ({', '.join('?' * 14)})"
_RESTORE = _INSERT.replace("INSERT", "INSERT OR IGNORE", 1)


STALE_PARTIAL_S = 3600.0  # a staging directory untouched this long belongs to no live submission


@dataclass(frozen=True)
class Job:
    """One row of the store. Times are Unix seconds; params and result are JSON values."""

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

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before for a different request."""

    def __init__(self, job: Job):
        super().__init__(job.id)
        self.job = job


class JobStore:
    def __init__(self, data_dir: Path):
        """Open the store of `data_dir`, checked and repaired as the module docstring says;
        StartupError when it cannot be used."""
        self.data_dir = Path(data_dir)
        self.jobs_dir = self.data_dir / "jobs"
        self._lock = threading.Lock()
        self._record_lock = threading.Lock()
        self._last_error: tuple[float, str] | None = None  # (time.monotonic(), message) of the last database error
        prepare_directory(self.data_dir)
        prepare_directory(self.jobs_dir)
        try:
            with exclusive_lock(self.data_dir / OPEN_LOCK):
                self._db = self._open_checked()
                try:
                    self._restore_if_empty()
                except BaseException:
                    self._db.close()
                    raise
        except (OSError, sqlite3.Error) as exc:
            raise StartupError(
                f"the job database {self.data_dir / DATABASE} cannot be used ({exc}): check that PENCIL_DATA_DIR is "
                "a writable local directory with free space, then restart"
            ) from exc

    @contextmanager
    def _database(self) -> Iterator[None]:
        """The connection, for this thread alone; a database error (not a constraint) is
        remembered for `recent_error`, then raised."""
        with self._lock:
            try:
                yield
            except sqlite3.IntegrityError:
                raise
            except sqlite3.DatabaseError as exc:
                self._last_error = (time.monotonic(), str(exc))
                raise

    def recent_error(self, within_s: float) -> str | None:
        """The last database error of any use of the store (requests, runner, metrics) if it
        happened within the last `within_s` seconds, else None."""
        last = self._last_error
        return last[1] if last is not None and time.monotonic() - last[0] <= within_s else None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------- opening --

    def _open_checked(self) -> sqlite3.Connection:
        """The database after PRAGMA quick_check; a corrupt one is moved aside for a new one."""
        path = self.data_dir / DATABASE
        damage = _damage(path) if path.exists() else None
        if damage is not None:
            aside = _move_aside(path)
            log.error(
                "the job database %s is corrupt (%s): moved it to %s and started a new one; jobs are restored "
                "from their folders in %s",
                path,
                damage,
                aside,
                self.jobs_dir,
            )
        db = _connect(path)
        try:
            _prepare(db)
        except BaseException:
            db.close()
            raise
        return db

    def _restore_if_empty(self) -> None:
        """A table without jobs while job folders exist (a database deleted, emptied or moved
        aside): insert the jobs their job.json files describe."""
        if self._db.execute("SELECT 1 FROM jobs LIMIT 1").fetchone() is not None:
            return
        folders = self._job_folders()
        if not folders:
            return
        records = {folder: _read_record(folder) for folder in folders}
        jobs = [_restored(job) for job in records.values() if job is not None]
        with self._transaction():
            self._db.executemany(_RESTORE, [_row(job) for job in jobs])
        log.warning(
            "the job database %s had no jobs: restored %d job(s) from the job.json files in %s",
            self.data_dir / DATABASE,
            len(jobs),
            self.jobs_dir,
        )
        unreadable = sorted(folder.name for folder, job in records.items() if job is None)
        if unreadable:
            log.warning(
                "%d job folder(s) in %s have no readable job.json (%s%s), so their jobs are lost; they are removed "
                "once older than PENCIL_JOB_RETENTION_DAYS",
                len(unreadable),
                self.jobs_dir,
                ", ".join(unreadable[:3]),
                ", ..." if len(unreadable) > 3 else "",
            )

    def _job_folders(self) -> list[Path]:
        if not self.jobs_dir.is_dir():
            return []
        return [path for path in self.jobs_dir.iterdir() if JOB_ID.fullmatch(path.name) and path.is_dir()]

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT), rolled back on an error."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    # ---------------------------------------------------------------- files --

    def input_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id / "input"

    def result_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id / "result"

    def result_file(self, job_id: str, name: str) -> tuple[Path, os.stat_result] | None:
        """The result file `name` of a job and what lstat said of it (the response serves
        that length and date), or None: a name that cannot be a result file (empty, hidden,
        a path, longer than NAME_MAX bytes), no such file, a symbolic link or anything but
        a regular file, or a result folder that is not the job's own (reached by a link)."""
        if not _is_file_name(name):
            return None
        folder = self.result_dir(job_id)
        if os.path.realpath(folder) != os.path.join(os.path.realpath(self.jobs_dir), job_id, "result"):
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

    def result_names(self, job_id: str) -> list[str]:
        """The names of a job's result files (regular files only), sorted."""
        folder = self.result_dir(job_id)
        with storage_errors("list the result files"):
            if not folder.is_dir():
                return []
            with os.scandir(folder) as entries:
                return sorted(e.name for e in entries if _is_file_name(e.name) and e.is_file(follow_symlinks=False))

    # -------------------------------------------------------------- writing --

    def create(
        self,
        kind: str,
        params: Mapping[str, Any],
        inputs: Mapping[str, bytes] | None = None,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        request_id: str | None = None,
    ) -> tuple[Job, bool]:
        """Store a queued job with its input files (its folder first, then the row, so a
        job in the table always has its inputs). Returns (job, created); with an
        Idempotency-Key seen before for the same request digest, the earlier job and
        False; for another digest, raises IdempotencyConflict. `request_id`: the submitting
        request's X-Request-ID, which the runner logs the job with. StorageError when the
        folder cannot be written (nothing is left of it)."""
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
        self._store_folder(job, inputs or {})
        try:
            with self._database():
                self._db.execute(_INSERT, _row(job))
        except sqlite3.IntegrityError:
            restored = self.get(job.id)  # another process starting up restored it from its folder
            if restored is not None:
                return restored, True
            remove_tree_quietly(self.jobs_dir / job.id)  # the same key raced us in: answer as for a retry
            return self.create(kind, params, inputs, idempotency_key, request_digest, request_id)
        except BaseException:
            remove_tree_quietly(self.jobs_dir / job.id)
            raise
        created = self.get(job.id)
        assert created is not None  # inserted above; jobs are only deleted by purge, once finished
        return created, True

    def _store_folder(self, job: Job, inputs: Mapping[str, bytes]) -> None:
        """The job's folder with its inputs and job.json, written and flushed under a hidden
        staging name, then renamed into place; on a failure nothing is left of it."""
        staging = self.jobs_dir / f".{job.id}.partial"
        folder = self.jobs_dir / job.id
        try:
            (staging / "input").mkdir(parents=True)
            for name, data in inputs.items():
                write_file(staging / "input" / name, data)
            write_file(staging / RECORD, _record(job))
            fsync_directory(staging / "input")
            fsync_directory(staging)
            os.rename(staging, folder)
            fsync_directory(self.jobs_dir)
        except OSError as exc:
            remove_tree_quietly(staging)
            remove_tree_quietly(folder)
            raise StorageError("store the job's input files", exc) from exc

    def _write_record(self, job_id: str) -> None:
        """Rewrite the job's job.json from its row. A failure is logged, not raised: the row
        stays the record, the copy only serves a rebuild."""
        with self._record_lock:  # the last writer writes the latest state
            job = self.get(job_id)
            folder = self.jobs_dir / job_id
            if job is None or not folder.is_dir():
                return
            try:
                write_atomically(folder / RECORD, _record(job))
            except OSError as exc:
                log.warning("could not update %s (%s); the database keeps the job's state", folder / RECORD, exc)

    def claim_next(self) -> Job | None:
        """The oldest queued job, now running; None when the queue is empty."""
        with self._database():
            row = self._db.execute(
                "UPDATE jobs SET status = 'running', started = ?, progress = 0 "
                "WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY created, id LIMIT 1) RETURNING *",
                (time.time(),),
            ).fetchone()
        return _job(row) if row else None

    def set_progress(self, job_id: str, progress: float) -> bool:
        """Record progress (0..1) of a running job; False when a cancel was asked for."""
        with self._database():
            row = self._db.execute(
                "UPDATE jobs SET progress = ? WHERE id = ? AND status = 'running' RETURNING cancel_requested",
                (min(max(progress, 0.0), 1.0), job_id),
            ).fetchone()
        return row is not None and not row["cancel_requested"]

    def succeed(self, job_id: str, result: Mapping[str, Any]) -> None:
        """Store a job's result: JSON, with NaN and infinities written as null (JSON has none,
        and a result the API could not send would turn every GET of it into a 500)."""
        self._finish(job_id, "succeeded", result=json.dumps(_json_safe(result), allow_nan=False), progress=1.0)

    def fail(self, job_id: str, error: str) -> None:
        self._finish(job_id, "failed", error=error)

    def mark_canceled(self, job_id: str) -> None:
        """A running job stopped at a checkpoint after a cancel."""
        self._finish(job_id, "canceled", error="canceled while running")

    def _finish(
        self,
        job_id: str,
        status: str,
        result: str | None = None,
        error: str | None = None,
        progress: float | None = None,
    ) -> None:
        with self._database():
            changed = self._db.execute(
                (
                    "UPDATE jobs SET status = ?, finished = ?, result = ?, error = ?, progress = COALESCE(?, "
                    "progress) WHERE id = ? AND status = 'running'"
                ),
                (status, time.time(), result, error, progress, job_id),
            ).rowcount
        if changed:
            self._write_record(job_id)

    def cancel(self, job_id: str) -> Job | None:
        """Cancel: a queued job at once, a running one at its next checkpoint (the flag is
        set; the runner finishes it as canceled). Finished jobs are left as they are.
        Returns the job after the change, or None when there is no such job."""
        with self._database():
            changed = self._db.execute(
                (
                    "UPDATE jobs SET status = 'canceled', finished = ?, error = 'canceled before it started' "
                    "WHERE id = ? AND status = 'queued'"
                ),
                (time.time(), job_id),
            ).rowcount
            changed += self._db.execute(
                "UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = 'running'", (job_id,)
            ).rowcount
        job = self.get(job_id)  # as the cancel left it: a running job may finish while its record is written
        if changed:
            self._write_record(job_id)
        return job

    def recover(self) -> int:
        """At start-up: jobs left running by a stopped process go back to the queue
        (a cancel asked for meanwhile is honoured). Returns how many were re-queued."""
        with self._database():
            canceled = self._db.execute(
                (
                    "UPDATE jobs SET status = 'canceled', finished = ?, error = 'canceled while running' "
                    "WHERE status = 'running' AND cancel_requested = 1 RETURNING id"
                ),
                (time.time(),),
            ).fetchall()
            moved = self._db.execute(
                "UPDATE jobs SET status = 'queued', started = NULL, progress = 0 WHERE status = 'running'"
            ).rowcount
        for row in canceled:
            self._write_record(row["id"])
        for partial in self.jobs_dir.glob(".*.partial"):  # submissions cut off before their row
            try:
                stale = time.time() - partial.stat().st_mtime > STALE_PARTIAL_S
            except FileNotFoundError:
                continue
            if stale:  # a newer one may be a submission another server process is writing
                remove_tree_quietly(partial)
        return moved

    def purge(self, older_than_s: float) -> int:
        """Delete finished jobs (rows and files) that finished more than `older_than_s` ago,
        and job folders without a row unchanged for as long."""
        cutoff = time.time() - older_than_s
        with self._database():
            ids = [
                row["id"]
                for row in self._db.execute(
                    "SELECT id FROM jobs WHERE finished IS NOT NULL AND finished < ?", (cutoff,)
                )
            ]
            self._db.executemany("DELETE FROM jobs WHERE id = ?", [(i,) for i in ids])
        for job_id in ids:
            remove_tree_quietly(self.jobs_dir / job_id)
        self._purge_orphans(cutoff)
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

    # -------------------------------------------------------------- reading --

    def get(self, job_id: str) -> Job | None:
        with self._database():
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def _by_key(self, key: str) -> Job | None:
        with self._database():
            row = self._db.execute("SELECT * FROM jobs WHERE idempotency_key = ?", (key,)).fetchone()
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
        with self._database():
            rows = self._db.execute(sql, (*args, limit + 1)).fetchall()
        jobs = [_job(row) for row in rows[:limit]]
        return jobs, (jobs[-1].id if len(rows) > limit else None)

    def counts(self) -> dict[tuple[str, str], int]:
        """(kind, status) -> number of jobs, for the metrics."""
        with self._database():
            rows = self._db.execute("SELECT kind, status, COUNT(*) AS n FROM jobs GROUP BY kind, status").fetchall()
        return {(row["kind"], row["status"]): row["n"] for row in rows}

    def probe(self) -> None:
        """Raise sqlite3.Error unless the database can be written and its job table read: a
        one-row write transaction on `health` and the scan of the table the metrics make
        (the table holds the jobs of the retention period: cheap enough for every readiness
        probe). Corruption elsewhere shows in the queries that meet it (recent_error)."""
        with self._database(), self._transaction():
            self._db.execute("INSERT OR REPLACE INTO health (id, checked) VALUES (1, ?)", (time.time(),))
            self._db.execute("SELECT kind, status, COUNT(*) FROM jobs GROUP BY kind, status").fetchall()


# ------------------------------------------------------------------ database --


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    return db


def _damage(path: Path) -> str | None:
    """What PRAGMA quick_check finds wrong with the database, or None when it is sound.
    Read-only, so that closing the check neither replays the WAL into a damaged file nor
    deletes it. Errors other than corruption (locked, unreadable) are raised as they are."""
    check = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        rows = [row[0] for row in check.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as exc:
        if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB):
            return str(exc)
        raise
    finally:
        check.close()
    return None if rows == ["ok"] else "; ".join(rows[:3])


def _move_aside(path: Path) -> Path:
    """Rename the database and its -wal and -shm files to `<name>.corrupt-<UTC time>...`
    (a WAL left beside a new database would be replayed into it); returns the new name."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    for n in range(2, 1000):
        if not os.path.lexists(aside):
            break
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.rename(path, aside)
    for suffix in ("-wal", "-shm"):
        if os.path.lexists(f"{path}{suffix}"):
            os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    fsync_directory(path.parent)
    return aside


def _prepare(db: sqlite3.Connection) -> None:
    """WAL, the schema, and the columns added since the first version (rows kept)."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    _add_column(db, "request_id", "TEXT")


def _add_column(db: sqlite3.Connection, name: str, declaration: str) -> None:
    columns = {row["name"] for row in db.execute("PRAGMA table_info(jobs)")}
    if name in columns:
        return
    try:
        db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declaration}")
    except sqlite3.OperationalError as exc:  # another server process added it first
        if "duplicate column" not in str(exc):
            raise


def _row(job: Job) -> tuple[Any, ...]:
    """The values of _INSERT for `job`."""
    return (
        job.id,
        job.kind,
        job.status,
        json.dumps(job.params),
        job.created,
        job.started,
        job.finished,
        job.progress,
        job.error,
        json.dumps(job.result) if job.result is not None else None,
        int(job.cancel_requested),
        job.idempotency_key,
        job.request_digest,
        job.request_id,
    )


def _job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        kind=row["kind"],
        status=row["status"],
        params=json.loads(row["params"]),
        created=row["created"],
        started=row["started"],
        finished=row["finished"],
        progress=row["progress"],
        error=row["error"],
        result=json.loads(row["result"]) if row["result"] else None,
        cancel_requested=bool(row["cancel_requested"]),
        idempotency_key=row["idempotency_key"],
        request_digest=row["request_digest"],
        request_id=row["request_id"],
    )


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
    """A job as it comes back from its record: one that was running is queued again (or
    canceled, when a cancel was asked for), as `JobStore.recover` does."""
    if job.status != "running":
        return job
    if job.cancel_requested:
        return replace(job, status="canceled", finished=time.time(), error="canceled while running")
    return replace(job, status="queued", started=None, progress=0.0)


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
