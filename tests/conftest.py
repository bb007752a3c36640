"""Fixtures of every test: `rng`, a generator with a fresh seed each run (the seed is
printed with the test's id, so pytest shows it on failure and the run can be replayed);
`postgres_url`, a fresh database on a real PostgreSQL server."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    seed = secrets.randbits(64)
    print(f"{request.node.nodeid}: numpy seed {seed}")
    return np.random.default_rng(seed)


# ------------------------------------------------------------------ PostgreSQL --
# Tests of the shared job store need a real PostgreSQL server: PENCIL_TEST_DATABASE_URL
# names one whose user may create databases (`.ci/postgres.sh` starts a throwaway one; CI
# does). Without it those tests skip, saying so; with PENCIL_TEST_REQUIRE_POSTGRES=1 (CI)
# they fail instead, so CI can never skip them by accident.

POSTGRES_URL_VARIABLE = "PENCIL_TEST_DATABASE_URL"


def _postgres_missing(reason: str) -> None:
    if os.environ.get("PENCIL_TEST_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"PENCIL_TEST_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(f"{reason}: start one with `export {POSTGRES_URL_VARIABLE}=$(bash .ci/postgres.sh)`")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The URL of a new, empty database on the test server, dropped after the test."""
    base = os.environ.get(POSTGRES_URL_VARIABLE)
    if not base:
        _postgres_missing(f"no PostgreSQL server for this test ({POSTGRES_URL_VARIABLE} is unset)")
    try:
        import psycopg
        from psycopg import conninfo
    except ImportError:
        _postgres_missing("psycopg is not installed (the `postgres` extra)")
    name = f"pencil_test_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        _postgres_missing(f"the PostgreSQL server at {POSTGRES_URL_VARIABLE} does not answer ({exc})")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield conninfo.make_conninfo(base, dbname=name)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
