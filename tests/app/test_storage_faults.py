"""Storage faults through the whole app (app/main.py, app/errors.py, app/metrics.py): every
storage error is an answer, never a 500 (507 insufficient_storage when space is missing,
503 storage_unavailable or database_unavailable with Retry-After otherwise), /readyz says
not ready while the data directory or the database cannot be used, /metrics keeps
answering, result files are only regular files of the job's folder, and a start-up that
cannot work ends with one clear line and no traceback. Faults are real where the process
allows (tests/app/storage_faults.py)."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys

import pytest
from pencil_testkit import admin_client, assert_api_error, free_port, metric_value, server_env, wait_for_job

from jobs.runner import JobRunner
from jobs.storage import StartupError
from tests.jobs.storage_faults import corrupt, read_only_database, run_limited, unwritable

TOKEN = "storage-faults-token"


def admin(make_client, **overrides):
    return admin_client(make_client, TOKEN, **overrides)


def files_under(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_result_file_names_that_cannot_exist_and_planted_links_are_404(make_client):
    client = admin(make_client)
    job_id = client.post("/jobs/svd", json={"spec": {"m": 8, "n": 6}}).json()["id"]
    assert wait_for_job(client, job_id)["status"] == "succeeded"
    results = client.app.state.jobs.result_dir(client.app.state.jobs.get(job_id))
    (results / "host").symlink_to("/etc/hostname")
    for name in ("a" * 256, "a" * 255, "host", ".s.npy.partial"):
        response = client.get(f"/jobs/{job_id}/files/{name}")
        assert_api_error(response, 404, "file_not_found")
    assert "host" not in client.get(f"/jobs/{job_id}/result").json()["files"]
    response = client.get(f"/jobs/{job_id}/files/s.npy")
    assert response.status_code == 200 and int(response.headers["content-length"]) == (results / "s.npy").stat().st_size


def test_an_unwritable_data_directory_is_503_and_not_ready_until_fixed(make_client):
    client = admin(make_client)
    data_dir = client.app.state.settings.data_dir
    before = files_under(data_dir)
    with unwritable(data_dir):
        for response in (
            client.post("/jobs/svd", json={"spec": {"m": 8, "n": 6}}),
            client.post("/corpora", params={"name": "t"}, content=b"some text\n"),
        ):
            body = assert_api_error(response, 503, "storage_unavailable", client)
            assert "Permission denied" in body["detail"] and int(response.headers["retry-after"]) > 0
        ready = client.get("/readyz")
        assert ready.status_code == 503 and int(ready.headers["retry-after"]) > 0
        assert ready.json()["problems"] == [f"data directory {data_dir} cannot be written: Permission denied"]
    assert files_under(data_dir) == before  # nothing half-written
    assert client.get("/readyz").json() == {"ready": True}
    assert client.post("/corpora", content=b"some text\n").status_code == 201


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_job_database_deleted_or_replaced_while_running_is_not_ready(make_client, how):
    """Writes would go to a file nobody reads again: /readyz says so at once (a restart
    rebuilds the jobs from their folders)."""
    client = admin(make_client)
    assert client.get("/readyz").status_code == 200
    path = client.app.state.jobs._db.path
    path.unlink()
    if how == "replaced":
        path.write_bytes(b"")  # another file at the same path
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert (
        f"job database cannot be written or read: the job database file {path} was {how}" in ready.json()["problems"][0]
    )


def test_low_free_space_on_the_data_directory_is_not_ready_with_the_figures(make_client, monkeypatch):
    """Real free space against a threshold above it (then one below it): 503 saying how much is
    free, before submissions start failing with 507."""
    import app.main
    from jobs.storage import free_bytes

    client = admin(make_client, min_free_bytes=2**62)
    data_dir = client.app.state.settings.data_dir
    ready = client.get("/readyz")
    assert ready.status_code == 503 and int(ready.headers["retry-after"]) > 0
    [problem] = ready.json()["problems"]
    assert problem.startswith(f"data directory {data_dir} has ") and "under PENCIL_MIN_FREE_BYTES (" in problem
    assert int(problem.split(" has ")[1].split(" bytes")[0].replace(",", "")) > 0
    client.app.state.settings.min_free_bytes = free_bytes(data_dir) // 2
    assert client.get("/readyz").json() == {"ready": True}
    monkeypatch.setattr(app.main, "free_bytes", lambda directory: 176_128)  # the 176 KB
    client.app.state.settings.min_free_bytes = 64 * 2**20
    assert client.get("/readyz").json()["problems"] == [
        f"data directory {data_dir} has 176,128 bytes free, under PENCIL_MIN_FREE_BYTES (67,108,864): "
        "submissions would fail with 507"
    ]
    client.app.state.settings.min_free_bytes = 0  # no check
    assert client.get("/readyz").json() == {"ready": True}


def test_a_job_whose_row_was_lost_is_back_after_a_restart(make_client):
    """The issue's case through the app: a row lost (a corrupted WAL tail and a crash) while its
    folder says succeeded answered 404; the next start gives it its row back."""
    client = admin(make_client)
    job_id = client.post("/jobs/svd", json={"spec": {"m": 8, "n": 6}}).json()["id"]
    assert wait_for_job(client, job_id)["status"] == "succeeded"
    with client.app.state.jobs._db.session(write=True) as db:
        db.run("DELETE FROM jobs WHERE id = ?", (job_id,))
    assert_api_error(client.get(f"/jobs/{job_id}"), 404, "job_not_found")
    client.__exit__(None, None, None)
    client = admin(make_client)
    assert client.get(f"/jobs/{job_id}").json()["status"] == "succeeded"
    assert client.get(f"/jobs/{job_id}/files/s.npy").status_code == 200


def test_uploads_past_the_file_size_limit_are_507_and_leave_nothing(tmp_path):
    """A real file-size limit (EFBIG, as a full disk gives ENOSPC): a corpus streamed to the
    data directory and an SVD upload spooled by the multipart parser."""
    result = run_limited(
        f"""
        import io, warnings
        warnings.simplefilter("ignore")
        from pathlib import Path
        import numpy as np
        from fastapi.testclient import TestClient
        from app.config import Settings
        from app.main import create_app

        settings = Settings(backend="cpu", data_dir=Path("data"), admin_token="{TOKEN}", log_level="critical")
        with TestClient(create_app(settings)) as client:
            client.headers["Authorization"] = "Bearer {TOKEN}"
            limit()
            corpus = client.post("/corpora", params={{"name": "big"}}, content=b"x" * 2_000_000)
            matrix = io.BytesIO()
            np.save(matrix, np.ones((500, 500)))
            svd = client.post("/jobs/svd", files={{"matrix": ("a.npy", matrix.getvalue(), "application/octet-stream")}})
            small = client.post("/corpora", content=b"fits")
            print(json.dumps({{
                "corpus": [corpus.status_code, corpus.json(), "retry-after" in corpus.headers],
                "svd": [svd.status_code, svd.json()],
                "small": small.status_code,
                "ready": client.get("/readyz").status_code,
                "jobs": client.get("/jobs").json()["jobs"],
                "files": sorted(str(p) for p in Path("data").rglob("*") if p.is_file()),
            }}))
        """,
        1_500_000,
        tmp_path,
    )
    assert result["corpus"][0] == 507 and result["corpus"][1]["error"] == "insufficient_storage"
    assert result["corpus"][1]["detail"].startswith("could not store the corpus: File too large")
    assert result["corpus"][2] is False  # space must be freed first: no Retry-After
    assert result["svd"][0] == 507 and result["svd"][1]["error"] == "insufficient_storage"
    assert result["svd"][1]["detail"].startswith("could not receive the upload (temporary files): File too large")
    assert result["small"] == 201 and result["ready"] == 200 and result["jobs"] == []
    corpora = [name for name in result["files"] if name.startswith("data/corpora/")]
    assert len(corpora) == 2 and all(name.endswith((".bin", ".json")) for name in corpora), result["files"]
    assert not [name for name in result["files"] if "partial" in name or name.startswith("data/jobs/")]


def test_a_read_only_database_is_503_database_unavailable_and_not_ready(make_client, monkeypatch):
    monkeypatch.setattr(JobRunner, "_work", lambda self: None)  # jobs stay queued
    client = admin(make_client)
    store = client.app.state.jobs
    with read_only_database(store):
        response = client.post("/jobs/svd", json={"spec": {"m": 8, "n": 6}})
        body = assert_api_error(response, 503, "database_unavailable", client)
        assert "readonly" in body["detail"] and int(response.headers["retry-after"]) > 0
        assert list(store.jobs_dir.iterdir()) == []  # the folder written before the row is gone again
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["problems"] == [
            "job database cannot be written or read: attempt to write a readonly database"
        ]
    assert client.post("/jobs/svd", json={"spec": {"m": 8, "n": 6}}).status_code == 202


def swap_in_corrupt_database(store, rng) -> None:
    """The running store's database damaged on disk (4 KiB of random bytes over page 2, the
    job table), as a disk fault would leave it."""
    database = store._db  # an SqliteDatabase
    with database._lock:
        database._db.close()  # checkpoints the WAL: the pages are all in the file
        corrupt(database.path, 4096, 4096, rng)
        database._db = sqlite3.connect(database.path, check_same_thread=False, isolation_level=None)
        database._db.row_factory = sqlite3.Row


def test_a_corrupt_database_answers_503_keeps_metrics_and_is_repaired_at_restart(make_client, rng, monkeypatch, caplog):
    monkeypatch.setattr(JobRunner, "_work", lambda self: None)  # jobs stay queued
    client = admin(make_client)
    ids = [client.post("/jobs/svd", json={"spec": {"m": 8, "n": n}}).json()["id"] for n in range(4, 8)]
    assert metric_value(client.get("/metrics").text, "pencil_jobs", kind="svd", status="queued") == 4
    swap_in_corrupt_database(client.app.state.jobs, rng)

    for response in (
        client.get("/jobs"),
        client.get(f"/jobs/{ids[0]}"),
        client.post("/jobs/search", json={"text": "needle in a haystack", "patterns": ["needle"]}),
    ):
        body = assert_api_error(response, 503, "database_unavailable", client)
        assert "malformed" in body["detail"] and int(response.headers["retry-after"]) > 0
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metric_value(metrics.text, "pencil_jobs", kind="svd", status="queued") == 4  # the last counts read
    assert metric_value(metrics.text, "pencil_job_store_read_failures_total") == 1
    ready = client.get("/readyz")
    assert ready.status_code == 503 and any("malformed" in p for p in ready.json()["problems"])
    assert sorted(p.name for p in client.app.state.jobs.jobs_dir.iterdir()) == sorted(ids)

    client.__exit__(None, None, None)
    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        client = admin(make_client)
    assert sorted(job["id"] for job in client.get("/jobs").json()["jobs"]) == sorted(ids)
    assert client.get("/readyz").json() == {"ready": True}
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "pencil.jobs"]
    assert "is corrupt (database disk image is malformed): moved it to" in error.getMessage()


def test_an_unusable_data_directory_stops_the_start_in_process(make_client, tmp_path):
    (tmp_path / "file").write_text("a file where the data directory should be")
    with pytest.raises(StartupError, match="PENCIL_DATA_DIR"):
        make_client(admin_token=TOKEN, data_dir=tmp_path / "file" / "data")


def test_an_unusable_data_directory_ends_the_server_with_one_clear_line(tmp_path):
    """`pencil-gpu serve`: a non-zero exit, one line saying what to do, no traceback."""
    (tmp_path / "file").write_text("a file where the data directory should be")
    env = server_env(tmp_path, admin_token=TOKEN, data_dir=str(tmp_path / "file" / "data"), log_format="text")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert "Traceback" not in output, output
    (line,) = [line for line in output.splitlines() if "cannot start" in line]
    assert " ERROR " in line and "Not a directory" in line and "PENCIL_DATA_DIR" in line, line


def test_the_job_counts_of_the_metrics_survive_a_failing_store(make_client):
    client = admin(make_client)
    assert client.post("/jobs/svd", json={"spec": {"m": 8, "n": 6}}).status_code == 202
    client.get("/metrics")
    store = client.app.state.jobs

    def failing():
        raise sqlite3.OperationalError("disk I/O error")

    store.counts = failing
    text = client.get("/metrics").text
    assert metric_value(text, "pencil_jobs", kind="svd") == 1
    assert metric_value(text, "pencil_job_store_read_failures_total") == 1
    assert metric_value(text, "pencil_http_requests_total", route="/metrics") >= 1
