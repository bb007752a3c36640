"""The shared job database: PostgreSQL (PENCIL_DATABASE_URL), for replicas on many hosts.

Every replica opens a small connection pool (psycopg 3). Claims use `FOR UPDATE SKIP
LOCKED`, so replicas claiming at once each get a different job without waiting on one
another; leases and the fencing token (`attempt`) are columns of the job row (see
jobs/store.py). Times of leases come from the database's clock, so hosts whose clocks
disagree still agree on when a lease ends.

Schema migrations are numbered; at start-up a replica takes a transaction-scoped advisory
lock, applies the ones the table `pencil_schema` does not list, and records them, so
replicas starting together apply each migration once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

log = logging.getLogger("pencil.jobs")

MIGRATION_LOCK = 0x70656E63  # "penc": the advisory lock replicas take to migrate one at a time
CONNECT_TIMEOUT_S = 5
# Waiting this long for a connection is a database error (503): statements take milliseconds,
# so a longer wait means the server is unreachable, and a request should not hang on it.
POOL_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 8  # per replica

# (version, name, SQL). Append only: a replica applies the versions its database lacks.
MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "jobs",
        """
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'canceled')),
            params TEXT NOT NULL,
            created DOUBLE PRECISION NOT NULL,
            started DOUBLE PRECISION,
            finished DOUBLE PRECISION,
            progress DOUBLE PRECISION NOT NULL DEFAULT 0,
            error TEXT,
            result TEXT,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            idempotency_key TEXT UNIQUE,
            request_digest TEXT,
            request_id TEXT,
            attempt INTEGER NOT NULL DEFAULT 0,
            replica TEXT,
            lease_until DOUBLE PRECISION
        );
        CREATE INDEX jobs_by_status ON jobs (status, created, id);
        CREATE INDEX jobs_by_created ON jobs (created, id);
        CREATE INDEX jobs_leases ON jobs (lease_until) WHERE status = 'running';
        CREATE TABLE health (id INTEGER PRIMARY KEY, checked DOUBLE PRECISION NOT NULL);
        """,
    ),
    (
        2,
        "webhooks",
        """
        CREATE TABLE webhooks (
            job_id TEXT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
            url TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            due DOUBLE PRECISION NOT NULL,
            delivered DOUBLE PRECISION,
            gave_up DOUBLE PRECISION,
            error TEXT
        );
        CREATE INDEX webhooks_due ON webhooks (due) WHERE delivered IS NULL AND gave_up IS NULL;
        """,
    ),
)


class PostgresSession:
    """Statements on one pooled connection, inside one transaction; the store writes `?`
    placeholders, psycopg takes `%s` (the store's SQL has no literal `?` or `%`)."""

    def __init__(self, connection: psycopg.Connection[dict[str, Any]]):
        self._connection = connection

    def one(self, sql: str, args: Sequence[Any] = ()) -> Mapping[str, Any] | None:
        return self._connection.execute(_placeholders(sql), args).fetchone()

    def all(self, sql: str, args: Sequence[Any] = ()) -> Sequence[Mapping[str, Any]]:
        return self._connection.execute(_placeholders(sql), args).fetchall()

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Execute; returns the number of rows changed."""
        return self._connection.execute(_placeholders(sql), args).rowcount

    def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._connection.cursor() as cursor:
            cursor.executemany(_placeholders(sql), rows)


class PostgresDatabase:
    """A pool of connections to `url`, migrated on opening. psycopg.Error when the server
    cannot be reached or refuses."""

    name = "PostgreSQL"
    NOW = "extract(epoch from clock_timestamp())::double precision"  # the database's clock, for leases
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    errors: tuple[type[Exception], ...] = (psycopg.Error,)
    integrity_errors: tuple[type[Exception], ...] = (psycopg.errors.IntegrityError,)

    def __init__(self, url: str):
        self._shown = shown_url(url)
        self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            url,
            min_size=1,
            max_size=MAX_CONNECTIONS,
            kwargs={"row_factory": dict_row, "connect_timeout": CONNECT_TIMEOUT_S, "application_name": "pencil-gpu"},
            timeout=POOL_TIMEOUT_S,
            check=ConnectionPool.check_connection,  # a server restart costs no request an error
            open=False,
            name="pencil-jobs",
        )
        try:
            # One plain connection first: its error says why (refused, unknown host, password),
            # where the pool's would only say that it timed out.
            psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S).close()
            self._pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            self.migrate()
        except BaseException:
            self._pool.close()
            raise

    def __str__(self) -> str:
        return self._shown

    @contextmanager
    def session(self, write: bool = False, wait_s: float | None = None) -> Iterator[PostgresSession]:
        """One connection and one transaction (committed at the end, rolled back on an error);
        past `wait_s` (default POOL_TIMEOUT_S) waiting for a connection, a PoolTimeout."""
        with self._pool.connection(timeout=wait_s) as connection:
            yield PostgresSession(connection)

    def close(self) -> None:
        self._pool.close()

    def verify(self) -> None:
        """Nothing to check: the server is the database (its reachability shows in the sessions)."""

    def migrate(self) -> None:
        """Apply the migrations the database lacks, one replica at a time."""
        applied = []
        with self._pool.connection() as connection:
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            connection.execute(
                "CREATE TABLE IF NOT EXISTS pencil_schema "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            done = {row["version"] for row in connection.execute("SELECT version FROM pencil_schema")}
            for version, name, sql in MIGRATIONS:
                if version in done:
                    continue
                connection.execute(sql)
                connection.execute("INSERT INTO pencil_schema (version, name) VALUES (%s, %s)", (version, name))
                applied.append(version)
            newer = sorted(done - {version for version, _, _ in MIGRATIONS})
        if applied:
            log.info("job database %s: applied schema migration(s) %s", self, ", ".join(map(str, applied)))
        if newer:
            log.warning(
                "job database %s has schema version(s) %s that this release does not know: a newer replica "
                "migrated it; this one runs on the columns it knows",
                self,
                ", ".join(map(str, newer)),
            )


def _placeholders(sql: str) -> str:
    return sql.replace("?", "%s")


def shown_url(url: str) -> str:
    """The URL as logs may show it: any password replaced by ***."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(an unreadable PENCIL_DATABASE_URL)"
    host, port, name = info.get("host", "localhost"), info.get("port", 5432), info.get("dbname", "")
    user = info.get("user", "")
    credentials = f"{user}:***@" if info.get("password") else (f"{user}@" if user else "")
    return f"postgresql://{credentials}{host}:{port}/{name}"
