"""app/config.py: Settings from PENCIL_* environment variables and a .env file, with
their bounds; get_settings caches one instance."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config import Settings, get_settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No PENCIL_* variable from the caller, and a working directory without .env."""
    for key in list(os.environ):
        if key.startswith("PENCIL_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_defaults():
    settings = Settings()
    assert settings.host == "127.0.0.1" and settings.port == 8000
    assert settings.backend == "auto"
    assert settings.workers == 2 and settings.max_queue == 16
    assert settings.max_upload_bytes == 25 * 1024 * 1024
    assert settings.max_pixels == 50_000_000
    assert settings.data_dir == Path("data")
    assert settings.log_level == "info"


def test_environment_variables_are_read(monkeypatch, tmp_path):
    values = {
        "PENCIL_HOST": "0.0.0.0",
        "PENCIL_PORT": "9000",
        "PENCIL_BACKEND": "cpu",
        "PENCIL_WORKERS": "5",
        "PENCIL_MAX_QUEUE": "0",
        "PENCIL_MAX_UPLOAD_BYTES": "4096",
        "PENCIL_MAX_PIXELS": "1000000",
        "PENCIL_DATA_DIR": str(tmp_path / "store"),
        "PENCIL_LOG_LEVEL": "debug",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.host == "0.0.0.0" and settings.port == 9000
    assert settings.backend == "cpu"
    assert settings.workers == 5 and settings.max_queue == 0
    assert settings.max_upload_bytes == 4096 and settings.max_pixels == 1_000_000
    assert settings.data_dir == tmp_path / "store"
    assert settings.log_level == "debug"


def test_names_are_case_insensitive(monkeypatch):
    monkeypatch.setenv("pencil_max_queue", "7")
    assert Settings().max_queue == 7


def test_keyword_arguments_win_over_environment(monkeypatch):
    monkeypatch.setenv("PENCIL_MAX_QUEUE", "3")
    assert Settings(max_queue=9).max_queue == 9


def test_dotenv_file_is_read_and_environment_wins(monkeypatch, tmp_path):
    (tmp_path / ".env").write_text("PENCIL_WORKERS=3\nPENCIL_MAX_QUEUE=4\nPENCIL_ADMIN_TOKEN=unused\nOTHER=1\n")
    settings = Settings()
    assert (settings.workers, settings.max_queue) == (3, 4)
    monkeypatch.setenv("PENCIL_MAX_QUEUE", "11")
    assert Settings().max_queue == 11


def test_unknown_pencil_variables_are_ignored(monkeypatch):
    monkeypatch.setenv("PENCIL_STREAMS", "4")
    monkeypatch.setenv("PENCIL_SOMETHING_NEW", "x")
    assert Settings().workers == 2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PENCIL_MAX_QUEUE", "-1"),
        ("PENCIL_MAX_QUEUE", "10001"),
        ("PENCIL_MAX_QUEUE", "many"),
        ("PENCIL_WORKERS", "0"),
        ("PENCIL_WORKERS", "257"),
        ("PENCIL_STREAMS", "0"),
        ("PENCIL_DEVICES", "0;1"),
        ("PENCIL_DEVICES", "gpu0"),
        ("PENCIL_GPU_MEMORY_FRACTION", "0"),
        ("PENCIL_GPU_MEMORY_FRACTION", "1.5"),
        ("PENCIL_BATCH_SHARE", "0"),
        ("PENCIL_LEASE_TIMEOUT_S", "0"),
        ("PENCIL_WORKERS", "1.5"),
        ("PENCIL_PORT", "0"),
        ("PENCIL_PORT", "70000"),
        ("PENCIL_BACKEND", "tpu"),
        ("PENCIL_LOG_LEVEL", "verbose"),
        ("PENCIL_MAX_UPLOAD_BYTES", "100"),
        ("PENCIL_MAX_PIXELS", "10"),
    ],
)
def test_invalid_values_raise(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert name.removeprefix("PENCIL_").lower() in str(caught.value).lower()


def test_get_settings_is_cached(monkeypatch):
    monkeypatch.setenv("PENCIL_WORKERS", "6")
    first = get_settings()
    monkeypatch.setenv("PENCIL_WORKERS", "8")
    assert get_settings() is first and first.workers == 6
    get_settings.cache_clear()
    assert get_settings().workers == 8


def test_create_app_reads_the_environment(monkeypatch, tmp_path):
    from fastapi.testclient import TestClient

    from app.main import create_app

    monkeypatch.setenv("PENCIL_BACKEND", "cpu")
    monkeypatch.setenv("PENCIL_WORKERS", "3")
    monkeypatch.setenv("PENCIL_MAX_QUEUE", "1")
    monkeypatch.setenv("PENCIL_DATA_DIR", str(tmp_path / "env-data"))
    monkeypatch.setenv("PENCIL_LOG_LEVEL", "warning")
    monkeypatch.setenv("PENCIL_ADMIN_TOKEN", "jobs-on")  # the data directory is made for the batch jobs
    with TestClient(create_app()) as client:
        body = client.get("/healthz").json()
    assert body["workers"] == 3 and body["queue"]["limit"] == 1 and body["backend"] == "cpu"
    assert (tmp_path / "env-data").is_dir()


def test_pixel_budget_defaults_to_the_largest_photo_beside_a_small_one(monkeypatch):
    settings = Settings()
    assert settings.large_render_pixels == 12_500_000
    assert settings.max_concurrent_pixels == 50_000_000 + 12_500_000
    monkeypatch.setenv("PENCIL_MAX_PIXELS", "20000000")
    monkeypatch.setenv("PENCIL_LARGE_RENDER_PIXELS", "4000000")
    assert Settings().max_concurrent_pixels == 24_000_000
    monkeypatch.setenv("PENCIL_MAX_CONCURRENT_PIXELS", "30000000")
    assert Settings().max_concurrent_pixels == 30_000_000


def test_api_keys_from_the_variable_and_the_file(monkeypatch, tmp_path):
    alice, bob, carol = "a" * 20, "b" * 20, "c" * 20
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# the CI's keys\nbob:{bob}\n\ncarol:{carol}  # since 2026\n")
    monkeypatch.setenv("PENCIL_API_KEYS", f"alice:{alice}")
    monkeypatch.setenv("PENCIL_API_KEYS_FILE", str(keys_file))
    assert Settings().api_key_table == {"alice": alice, "bob": bob, "carol": carol}
    assert alice not in repr(Settings())  # a secret, like the admin token


def test_no_api_keys_by_default():
    settings = Settings()
    assert settings.api_key_table == {}
    assert settings.cors_origins == "" and settings.metrics_token is None
    assert settings.rate_limit == 0 and settings.live_sessions_per_client == 0


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("PENCIL_API_KEYS", "alice:short", "16 to 256"),
        ("PENCIL_API_KEYS", "alice", "entry 1"),
        ("PENCIL_API_KEYS_FILE", "/nonexistent/keys", "cannot be read"),
        ("PENCIL_CORS_ORIGINS", "app.example.com", "PENCIL_CORS_ORIGINS"),
        ("PENCIL_RATE_LIMIT", "-1", "PENCIL_RATE_LIMIT"),
    ],
)
def test_bad_access_settings_stop_the_start(monkeypatch, variable, value, words):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert words in str(refused.value) or variable.removeprefix("PENCIL_").lower() in str(refused.value)


# Set by `pencil-gpu serve` for the processes it starts, not by operators.
INTERNAL_SETTINGS = {"process_index", "live_slots_dir"}


def test_every_setting_is_documented_with_its_default():
    """README's settings tables, or docs/jobs.md and docs/live.md, which the README points to
    for the batch jobs and /live: a row (or item) naming the variable, with its default."""
    repo = Path(__file__).resolve().parents[2]
    text = "\n".join(path.read_text() for path in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))])
    undocumented = [
        f"PENCIL_{name.upper()}"
        for name in Settings.model_fields
        if name not in INTERNAL_SETTINGS
        and not re.search(rf"(\| `PENCIL_{name.upper()}` \||`PENCIL_{name.upper()}` \(default)", text)
    ]
    assert not undocumented, f"settings the docs do not list: {undocumented}"
