"""The job store: one SQLite database (WAL) under PENCIL_DATA_DIR, and a directory per job
beside it for the job's input and result files.

    <data_dir>/jobs.sqlite3
    <data_dir>/jobs/<id>/input/...     stored before the 202 answers the submission
    <data_dir>/jobs/<id>/result/...    written by the runner, then the row says succeeded

Every state change is one transaction, so a crash leaves each job in a state it really
had; at start-up `recover()` puts the jobs that were running back in the queue. A lock
serialises the process's use of its one connection (the runner's threads and the event
loop share it; the statements are short).
"""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUSES = ("queued", "running", "succeeded", "failed", "canceled")
FINISHED = ("succeeded", "failed", "canceled")

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
"""


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
        self.data_dir = Path(data_dir)
        self.jobs_dir = self.data_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.data_dir / "jobs.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._add_column("request_id", "TEXT")  # databases made before the column: add it, keep the rows

    def _add_column(self, name: str, declaration: str) -> None:
        columns = {row["name"] for row in self._db.execute("PRAGMA table_info(jobs)")}
        if name in columns:
            return
        try:
            self._db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declaration}")
        except sqlite3.OperationalError as exc:  # another server process added it first
            if "duplicate column" not in str(exc):
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---------------------------------------------------------------- files --

    def input_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id / "input"

    def result_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id / "result"

    def result_file(self, job_id: str, name: str) -> Path | None:
        """The result file `name` of a job, or None (unknown job, unknown name, or a name
        that tries to leave the job's directory)."""
        folder = self.result_dir(job_id)
        path = folder / name
        if path.parent != folder or not path.is_file():
            return None
        return path

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
        """Store a queued job with its input files (written first, then the row, so a job
        in the table always has its inputs). Returns (job, created); with an
        Idempotency-Key seen before for the same request digest, the earlier job and
        False; for another digest, raises IdempotencyConflict. `request_id`: the submitting
        request's X-Request-ID, which the runner logs the job with."""
        if idempotency_key is not None:
            earlier = self._by_key(idempotency_key)
            if earlier is not None:
                if earlier.request_digest != request_digest:
                    raise IdempotencyConflict(earlier)
                return earlier, False
        job_id = uuid.uuid4().hex
        staging = self.jobs_dir / f".{job_id}.partial"
        (staging / "input").mkdir(parents=True)
        for name, data in (inputs or {}).items():
            (staging / "input" / name).write_bytes(data)
        staging.rename(self.jobs_dir / job_id)
        try:
            with self._lock:
                self._db.execute(
                    "INSERT INTO jobs (id, kind, status, params, created, idempotency_key, request_digest, request_id) "
                    "VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)",
                    (job_id, kind, json.dumps(dict(params)), time.time(), idempotency_key, request_digest, request_id),
                )
        except sqlite3.IntegrityError:  # the same key raced us in: answer as for a retry
            shutil.rmtree(self.jobs_dir / job_id, ignore_errors=True)
            return self.create(kind, params, inputs, idempotency_key, request_digest, request_id)
        created = self.get(job_id)
        assert created is not None  # inserted above; jobs are only deleted by purge, once finished
        return created, True

    def claim_next(self) -> Job | None:
        """The oldest queued job, now running; None when the queue is empty."""
        with self._lock:
            row = self._db.execute(
                "UPDATE jobs SET status = 'running', started = ?, progress = 0 "
                "WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY created, id LIMIT 1) RETURNING *",
                (time.time(),),
            ).fetchone()
        return _job(row) if row else None

    def set_progress(self, job_id: str, progress: float) -> bool:
        """Record progress (0..1) of a running job; False when a cancel was asked for."""
        with self._lock:
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
        with self._lock:
            self._db.execute(
                (
                    "UPDATE jobs SET status = ?, finished = ?, result = ?, error = ?, progress = COALESCE(?, "
                    "progress) WHERE id = ? AND status = 'running'"
                ),
                (status, time.time(), result, error, progress, job_id),
            )

    def cancel(self, job_id: str) -> Job | None:
        """Cancel: a queued job at once, a running one at its next checkpoint (the flag is
        set; the runner finishes it as canceled). Finished jobs are left as they are.
        Returns the job after the change, or None when there is no such job."""
        with self._lock:
            self._db.execute(
                (
                    "UPDATE jobs SET status = 'canceled', finished = ?, error = 'canceled before it started' "
                    "WHERE id = ? AND status = 'queued'"
                ),
                (time.time(), job_id),
            )
            self._db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = 'running'", (job_id,))
        return self.get(job_id)

    def recover(self) -> int:
        """At start-up: jobs left running by a stopped process go back to the queue
        (a cancel asked for meanwhile is honoured). Returns how many were re-queued."""
        with self._lock:
            self._db.execute(
                (
                    "UPDATE jobs SET status = 'canceled', finished = ?, error = 'canceled while running' "
                    "WHERE status = 'running' AND cancel_requested = 1"
                ),
                (time.time(),),
            )
            moved = self._db.execute(
                "UPDATE jobs SET status = 'queued', started = NULL, progress = 0 WHERE status = 'running'"
            ).rowcount
        for partial in self.jobs_dir.glob(".*.partial"):  # submissions cut off before their row
            try:
                stale = time.time() - partial.stat().st_mtime > STALE_PARTIAL_S
            except FileNotFoundError:
                continue
            if stale:  # a newer one may be a submission another server process is writing
                shutil.rmtree(partial, ignore_errors=True)
        return moved

    def purge(self, older_than_s: float) -> int:
        """Delete finished jobs (rows and files) that finished more than `older_than_s` ago."""
        cutoff = time.time() - older_than_s
        with self._lock:
            ids = [
                row["id"]
                for row in self._db.execute(
                    "SELECT id FROM jobs WHERE finished IS NOT NULL AND finished < ?", (cutoff,)
                )
            ]
            self._db.executemany("DELETE FROM jobs WHERE id = ?", [(i,) for i in ids])
        for job_id in ids:
            shutil.rmtree(self.jobs_dir / job_id, ignore_errors=True)
        return len(ids)

    # -------------------------------------------------------------- reading --

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def _by_key(self, key: str) -> Job | None:
        with self._lock:
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
        with self._lock:
            rows = self._db.execute(sql, (*args, limit + 1)).fetchall()
        jobs = [_job(row) for row in rows[:limit]]
        return jobs, (jobs[-1].id if len(rows) > limit else None)

    def counts(self) -> dict[tuple[str, str], int]:
        """(kind, status) -> number of jobs, for the metrics."""
        with self._lock:
            rows = self._db.execute("SELECT kind, status, COUNT(*) AS n FROM jobs GROUP BY kind, status").fetchall()
        return {(row["kind"], row["status"]): row["n"] for row in rows}


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


def _json_safe(value: Any) -> Any:
    """`value` with every float that is NaN or infinite replaced by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value
