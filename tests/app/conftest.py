"""Fixtures of the HTTP service tests: an app per test (own metrics registry, own data
directory, CPU backend) driven through Starlette's TestClient (the fresh `rng` is tests/conftest.py's)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import pencil_testkit`

with warnings.catch_warnings():  # Starlette's TestClient warns that httpx is deprecated
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:Using `httpx` with `starlette.testclient` is deprecated")


def make_settings(tmp_path: Path, **overrides) -> Settings:
    values = {
        "backend": "cpu",
        "workers": 2,
        "max_queue": 16,
        "data_dir": tmp_path / "data",
        "log_level": "warning",
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def make_client(tmp_path):
    """make_client(**settings_overrides, raise_server_exceptions=True) -> a started
    TestClient (lifespan run) on a fresh app; all are closed at teardown."""
    clients = []

    def make(raise_server_exceptions: bool = True, **overrides) -> TestClient:
        client = TestClient(
            create_app(make_settings(tmp_path, **overrides)), raise_server_exceptions=raise_server_exceptions
        )
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in reversed(clients):
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client()
