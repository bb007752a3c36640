"""The embedded job database: one SQLite file (WAL) in the data directory, for one host.

Opening it checks it with PRAGMA quick_check: a corrupt database (or a file that is no
database) is moved aside as `jobs.sqlite3.corrupt-<UTC time>` with its -wal and -shm, one
ERROR line saying where, and a new one is made (jobs/store.py then restores the jobs
from their folders). One lock serialises the process's use of its one connection (the
runner's threads and the event loop share it; the statements are short).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jobs.storage import fsync_directory

log = logging.getLogger("pencil.jobs")

FILE_NAME = "jobs.sqlite3"
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
CREATE TABLE IF NOT EXISTS webhooks (
    job_id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    due REAL NOT NULL,
    delivered REAL,
    gave_up REAL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS webhooks_due ON webhooks (due) WHERE delivered IS NULL AND gave_up IS NULL;
"""
# Columns added since the first version (rows kept): name -> declaration.
_ADDED_COLUMNS = {
    "request_id": "TEXT",
    "attempt": "INTEGER NOT NULL DEFAULT 0",
    "replica": "TEXT",
    "lease_until": "REAL",
}


class SqliteSession:
    """Statements on the one connection; `?` placeholders; rows as sqlite3.Row."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def one(self, sql: str, args: Sequence[Any] = ()) -> Mapping[str, Any] | None:
        return self._db.execute(sql, args).fetchone()

    def all(self, sql: str, args: Sequence[Any] = ()) -> Sequence[Mapping[str, Any]]:
        return self._db.execute(sql, args).fetchall()

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Execute; returns the number of rows changed."""
        return self._db.execute(sql, args).rowcount

    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._db.executemany(sql, rows)


class SqliteDatabase:
    """The SQLite job database of `data_dir`, checked (and moved aside when corrupt) on opening."""

    name = "SQLite"
    NOW = "((julianday('now') - 2440587.5) * 86400.0)"  # Unix seconds, as the server's clock says
    SKIP_LOCKED = ""  # one writer at a time: nothing to skip
    errors: tuple[type[Exception], ...] = (sqlite3.DatabaseError,)
    integrity_errors: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)

    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / FILE_NAME
        self._lock = threading.Lock()
        self._db = self._open_checked()
        self._file = _identity(self.path)  # the file opened, to notice it deleted or replaced

    def __str__(self) -> str:
        return str(self.path)

    @contextmanager
    def session(self, write: bool = False, wait_s: float | None = None) -> Iterator[SqliteSession]:
        """The connection, for this thread alone; `write`: one transaction (BEGIN IMMEDIATE
        ... COMMIT, rolled back on an error), else each statement commits on its own. Past
        `wait_s` waiting for another thread's session, sqlite3.OperationalError."""
        if not self._lock.acquire(timeout=-1 if wait_s is None else wait_s):
            raise sqlite3.OperationalError(f"the job database was busy for {wait_s:g} s")
        try:
            if not write:
                yield SqliteSession(self._db)
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield SqliteSession(self._db)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def verify(self) -> None:
        """sqlite3.OperationalError when the file at the path is no longer the one open: it
        was deleted or replaced, and writes would go to a file nobody will read again (a
        restart rebuilds the jobs from their folders)."""
        try:
            now = _identity(self.path)
        except FileNotFoundError:
            raise sqlite3.OperationalError(f"the job database file {self.path} was deleted") from None
        if now != self._file:
            raise sqlite3.OperationalError(f"the job database file {self.path} was replaced by another file")

    def _open_checked(self) -> sqlite3.Connection:
        """The database after PRAGMA quick_check; a corrupt one is moved aside for a new one."""
        damage = _damage(self.path) if self.path.exists() else None
        if damage is not None:
            aside = _move_aside(self.path)
            log.error(
                "the job database %s is corrupt (%s): moved it to %s and started a new one; jobs are restored "
                "from their folders in %s",
                self.path,
                damage,
                aside,
                self.path.parent / "jobs",
            )
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            _prepare(db)
        except BaseException:
            db.close()
            raise
        return db


def _identity(path: Path) -> tuple[int, int]:
    """(device, inode) of a file: which file a path names now."""
    status = os.stat(path)
    return status.st_dev, status.st_ino


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
    for name, declaration in _ADDED_COLUMNS.items():
        _add_column(db, name, declaration)


def _add_column(db: sqlite3.Connection, name: str, declaration: str) -> None:
    columns = {row["name"] for row in db.execute("PRAGMA table_info(jobs)")}
    if name in columns:
        return
    try:
        db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declaration}")
    except sqlite3.OperationalError as exc:  # another server process added it first
        if "duplicate column" not in str(exc):
            raise
