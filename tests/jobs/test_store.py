"""jobs/store.py: the SQLite job store: states and their transitions, inputs stored
before the row, idempotency, cancel, recovery after a stop, paging, retention; result
files served only as regular files of the job's own folder; storage faults (an unwritable
folder, a file-size limit, a read-only database) that leave nothing half-written; job.json
records and the rebuild of a lost or corrupt database from them."""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from jobs.storage import StartupError, StorageError, create_owned
from jobs.store import PROBE_WAIT_S, Claim, IdempotencyConflict, JobStore
from tests.jobs.storage_faults import corrupt, read_only_database, run_limited, unwritable


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    """A store on each database: SQLite, and PostgreSQL when a test server is configured."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    store = JobStore(tmp_path / "data", url, replica="test-replica")
    yield store
    store.close()


def test_a_job_goes_queued_running_succeeded(store):
    job, created = store.create("svd", {"m": 3}, {"matrix.npy": b"abc"})
    assert created and job.status == "queued" and job.params == {"m": 3} and job.progress == 0
    assert (store.input_dir(job.id) / "matrix.npy").read_bytes() == b"abc"
    running = store.claim_next()
    assert running.id == job.id and running.status == "running" and running.started >= job.created
    assert store.claim_next() is None
    assert running.attempt == 1 and running.replica == "test-replica"
    assert store.set_progress(running, 0.5) is Claim.HELD
    assert store.get(job.id).progress == 0.5
    assert store.succeed(running, {"values": [1.0, 2.0]})
    done = store.get(job.id)
    assert (done.status, done.progress, done.result) == ("succeeded", 1.0, {"values": [1.0, 2.0]})
    assert done.finished >= done.started and done.is_finished


def test_non_finite_numbers_in_a_result_are_stored_as_null(store):
    """JSON has no NaN or infinity: a result holding them (an overflowed product, say) is
    stored with null there, so the API can always send it."""
    job, _ = store.create("cs256", {}, {})
    store.succeed(
        store.claim_next(),
        {"error": float("inf"), "nested": {"values": [1.5, float("nan"), -float("inf")], "pair": (2.0, 3)}, "ok": 0.25},
    )
    assert store.get(job.id).result == {
        "error": None,
        "nested": {"values": [1.5, None, None], "pair": [2.0, 3]},
        "ok": 0.25,
    }


def test_failure_keeps_the_message(store):
    job, _ = store.create("svd", {})
    store.fail(store.claim_next(), "ValueError: no")
    assert (store.get(job.id).status, store.get(job.id).error) == ("failed", "ValueError: no")


def test_jobs_are_claimed_oldest_first(store):
    ids = [store.create("svd", {"i": i})[0].id for i in range(3)]
    assert [store.claim_next().id for _ in ids] == ids


def test_the_sqlite_database_is_in_wal_mode(tmp_path):
    JobStore(tmp_path / "data").close()
    mode = sqlite3.connect(tmp_path / "data" / "jobs.sqlite3").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_idempotency_key_returns_the_same_job_or_conflicts(store):
    first, created = store.create("svd", {"m": 1}, idempotency_key="k1", request_digest="d1")
    again, created_again = store.create("svd", {"m": 1}, idempotency_key="k1", request_digest="d1")
    assert created and not created_again and again.id == first.id
    with pytest.raises(IdempotencyConflict) as caught:
        store.create("svd", {"m": 2}, idempotency_key="k1", request_digest="d2")
    assert caught.value.job.id == first.id
    assert len(store.page()[0]) == 1


def test_cancel_a_queued_job_at_once_and_a_running_one_at_its_checkpoint(store):
    queued, _ = store.create("svd", {})
    running, _ = store.create("svd", {})
    claim = store.claim_next()
    assert claim.id == queued.id  # the older one runs
    store.cancel(running.id)  # still queued: canceled now
    assert store.get(running.id).status == "canceled"
    after = store.cancel(queued.id)
    assert after.status == "running" and after.cancel_requested
    assert store.set_progress(claim, 0.3) is Claim.CANCEL  # the checkpoint sees the request
    assert store.mark_canceled(claim)
    assert store.get(queued.id).status == "canceled"
    assert store.cancel("nope") is None


def test_finishing_is_refused_for_a_job_that_is_not_running(store):
    job, _ = store.create("svd", {})
    store.cancel(job.id)
    assert not store.succeed(replace(job, attempt=1), {"late": True})  # a runner that lost a race must not resurrect it
    assert store.get(job.id).status == "canceled"


def test_recover_requeues_running_jobs_and_honours_cancels(tmp_path):
    store = JobStore(tmp_path / "data")
    left_running, _ = store.create("svd", {"a": 1})
    canceled_meanwhile, _ = store.create("svd", {"a": 2})
    waiting, _ = store.create("svd", {"a": 3})
    store.claim_next()
    store.claim_next()
    store.cancel(canceled_meanwhile.id)
    (store.jobs_dir / ".cut-off.partial" / "input").mkdir(parents=True)  # its process died mid-write
    (store.jobs_dir / ".cut-off.partial" / "job.json").write_text("{}")  # a moment ago: its lock died too
    (store.jobs_dir / ".in-progress.partial").mkdir()  # another process's submission, being written now
    owner = create_owned(store.jobs_dir / ".in-progress.partial" / "job.json")
    store.close()

    reopened = JobStore(tmp_path / "data")
    assert reopened.recover() == 1
    assert reopened.get(left_running.id).status == "queued" and reopened.get(left_running.id).started is None
    assert reopened.get(canceled_meanwhile.id).status == "canceled"
    assert reopened.get(waiting.id).status == "queued"
    reopened.purge(older_than_s=86400)
    assert [p.name for p in reopened.jobs_dir.glob(".*.partial")] == [".in-progress.partial"]
    os.close(owner)
    assert [reopened.claim_next().id, reopened.claim_next().id] == [left_running.id, waiting.id]
    reopened.close()


def test_pages_cover_every_job_once_newest_first_with_filters(store):
    ids = []
    for i in range(7):
        ids.append(store.create("svd" if i % 2 else "other", {"i": i})[0].id)
        time.sleep(0.002)  # distinct creation times
    seen, token = [], None
    while True:
        jobs, token = store.page(limit=3, after=token)
        seen += [job.id for job in jobs]
        if token is None:
            break
    assert seen == ids[::-1]
    assert [job.id for job in store.page(kind="svd")[0]] == [ids[5], ids[3], ids[1]]
    store.claim_next()
    assert [job.id for job in store.page(status="running")[0]] == [ids[0]]
    assert store.counts() == {("svd", "queued"): 3, ("other", "queued"): 3, ("other", "running"): 1}


def test_result_files_cannot_leave_the_job_folder(store):
    job, _ = store.create("svd", {})
    store.result_dir(job).mkdir(parents=True)
    (store.result_dir(job) / "s.npy").write_bytes(b"x")
    path, status = store.result_file(job, "s.npy")
    assert path.read_bytes() == b"x" and status.st_size == 1
    for name in ("../input", "..", "../../jobs.sqlite3", "missing.npy", "/etc/passwd"):
        assert store.result_file(job, name) is None


def test_purge_removes_old_finished_jobs_and_their_files(store):
    old, _ = store.create("svd", {}, {"matrix.npy": b"1"})
    store.fail(store.claim_next(), "x")
    fresh, _ = store.create("svd", {})
    time.sleep(0.05)
    assert store.purge(older_than_s=0.01) == 1
    assert store.get(old.id) is None and not (store.jobs_dir / old.id).exists()
    assert store.get(fresh.id) is not None  # queued jobs are never purged


# ------------------------------------------------------------ result files --


def test_names_that_cannot_be_result_files_are_none(store):
    """Not an OSError (File name too long) for a name over NAME_MAX bytes: None, as for any
    name a result file cannot have."""
    job, _ = store.create("svd", {})
    store.result_dir(job).mkdir(parents=True)
    (store.result_dir(job) / ".s.npy.partial").write_bytes(b"being written")
    for name in ("a" * 256, "é" * 128, "a" * 255, "", ".s.npy.partial", "a\0b", "x/../s.npy"):
        assert store.result_file(job, name) is None, name


def test_result_files_are_regular_files_of_the_jobs_own_folder(store, tmp_path):
    """No symbolic link is followed, neither a planted file nor a planted result folder."""
    job, _ = store.create("svd", {})
    other, _ = store.create("svd", {})
    results = store.result_dir(job)
    results.mkdir(parents=True)
    (results / "s.npy").write_bytes(b"ours")
    (results / "host").symlink_to("/etc/hostname")
    (results / "dangling").symlink_to(tmp_path / "nowhere")
    (results / "folder").mkdir()
    os.mkfifo(results / "pipe")
    for name in ("host", "dangling", "folder", "pipe"):
        assert store.result_file(job, name) is None, name
    assert store.result_names(job) == ["s.npy"]
    store.result_dir(other).symlink_to(results)  # another job's folder, reached by a link
    assert store.result_file(other, "s.npy") is None
    assert store.result_file(job, "s.npy")[0].read_bytes() == b"ours"


# ------------------------------------------------------------ storage faults --


def test_a_submission_that_cannot_be_written_leaves_nothing(store):
    with unwritable(store.jobs_dir), pytest.raises(StorageError) as caught:
        store.create("svd", {"m": 3}, {"matrix.npy": b"abc"})
    assert caught.value.errno == errno.EACCES and not caught.value.out_of_space
    assert str(caught.value) == "could not store the job's input files: Permission denied"
    assert list(store.jobs_dir.iterdir()) == [] and store.page()[0] == []


def test_inputs_past_the_file_size_limit_leave_nothing(tmp_path):
    result = run_limited(
        """
        from pathlib import Path
        from jobs.store import JobStore
        store = JobStore(Path("data"))
        store.create("svd", {}, {"small.npy": b"fits"})
        limit()
        try:
            store.create("svd", {"m": 1000}, {"small.npy": b"fits", "matrix.npy": b"x" * 2_000_000})
            error = None
        except OSError as exc:
            error = [type(exc).__name__, exc.errno, str(exc)]
        print(json.dumps({"error": error, "jobs": len(store.page()[0]), "folders": len(os.listdir("data/jobs"))}))
        """,
        1_000_000,
        tmp_path,
    )
    assert result == {
        "error": ["StorageError", errno.EFBIG, "could not store the job's input files: File too large"],
        "jobs": 1,
        "folders": 1,
    }


def test_the_probe_fails_while_the_database_cannot_be_written(tmp_path):
    store = JobStore(tmp_path / "data")
    store.probe()
    with read_only_database(store), pytest.raises(sqlite3.OperationalError, match="readonly"):
        store.probe()
    store.probe()
    assert store._db._db.in_transaction is False
    store.close()


def test_the_probe_waits_at_most_its_limit_for_a_busy_database(tmp_path):
    """/readyz must answer while a long statement holds the database (here: another thread's
    session), within PROBE_WAIT_S, and say why."""
    store = JobStore(tmp_path / "data")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._session(write=True):
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(5)
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="busy for 0.5 s"):
            store.probe()
        assert PROBE_WAIT_S <= time.monotonic() - started < PROBE_WAIT_S + 0.5
        assert store.recent_error(5) == "the job database was busy for 0.5 s"
    finally:
        release.set()
        holder.join()
    store.probe()
    store.close()


def test_an_unusable_data_directory_is_a_startup_error_saying_what_to_do(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StartupError, match="cannot be written.*PENCIL_DATA_DIR"):
        JobStore(tmp_path / "file" / "data")
    (tmp_path / "data").mkdir()
    with unwritable(tmp_path / "data"), pytest.raises(StartupError, match="Permission denied"):
        JobStore(tmp_path / "data")


# ------------------------------------------------------- records and rebuild --


def record(store, job_id: str) -> dict:
    return json.loads((store.jobs_dir / job_id / "job.json").read_text())


def test_job_json_follows_the_changes_that_matter(store):
    done, _ = store.create("svd", {"m": 3}, {"matrix.npy": b"abc"}, idempotency_key="k", request_digest="d")
    assert record(store, done.id) | {"version": 0} == asdict(done) | {"version": 0}
    claim = store.claim_next()
    store.set_progress(claim, 0.5)
    assert record(store, done.id)["status"] == "queued"  # running and progress are not mirrored
    store.succeed(claim, {"values": [1.0, float("nan")]})
    assert record(store, done.id) | {"version": 0} == asdict(store.get(done.id)) | {"version": 0}
    assert record(store, done.id)["result"] == {"values": [1.0, None]}
    failed, _ = store.create("svd", {})
    store.fail(store.claim_next(), "ValueError: no")
    assert (record(store, failed.id)["status"], record(store, failed.id)["error"]) == ("failed", "ValueError: no")
    canceled, _ = store.create("svd", {})
    store.cancel(canceled.id)
    assert record(store, canceled.id)["status"] == "canceled"
    assert sorted(p.name for p in (store.jobs_dir / done.id).iterdir()) == ["input", "job.json"]


def make_jobs(store) -> dict[str, str]:
    """One job in every state (and a running one with a cancel asked for); name -> id."""
    ids = {}
    for name in ("succeeded", "failed", "running", "cancel_asked", "canceled", "queued"):
        ids[name] = store.create("svd", {"name": name}, {"matrix.npy": name.encode()}, idempotency_key=name)[0].id
    claims = {name: store.claim_next() for name in ("succeeded", "failed", "running", "cancel_asked")}
    assert {name: claim.id for name, claim in claims.items()} == {name: ids[name] for name in claims}
    store.succeed(claims["succeeded"], {"values": [3.0]})
    store.fail(claims["failed"], "ValueError: no")
    store.cancel(ids["cancel_asked"])
    store.cancel(ids["canceled"])
    return ids


def assert_restored(store, before: dict, ids: dict[str, str]) -> None:
    """Every job as it was, except that a running one is queued again (canceled when asked)."""
    for name, job_id in ids.items():
        job = store.get(job_id)
        expected = before[name]
        if name == "running":
            assert (job.status, job.started, job.progress) == ("queued", None, 0.0)
            # its job.json was written when it was submitted: the claim (attempt 1) is not mirrored
            expected = replace(expected, status="queued", started=None, progress=0.0, replica=None, attempt=0)
        if name == "cancel_asked":
            assert (job.status, job.error) == ("canceled", "canceled while running") and job.finished
            expected = replace(expected, status="canceled", finished=job.finished, error=job.error)
        assert job == expected, name
        assert (store.input_dir(job_id) / "matrix.npy").read_bytes() == name.encode()
    assert store.create("svd", {}, idempotency_key="succeeded", request_digest=None)[0].id == ids["succeeded"]


def snapshot(store, ids: dict[str, str]) -> dict:
    """The jobs as job.json last recorded them (running ones as they were submitted)."""
    return {
        name: store.get(job_id) if name not in ("running", "cancel_asked") else None for name, job_id in ids.items()
    }


@pytest.mark.parametrize("loss", ["deleted", "emptied", "rows deleted"])
def test_a_lost_database_is_rebuilt_from_the_job_folders(tmp_path, caplog, loss):
    store = JobStore(tmp_path / "data")
    ids = make_jobs(store)
    before = {name: store.get(job_id) for name, job_id in ids.items()}
    before["running"] = replace(before["running"], started=None, progress=0.0, status="queued")
    database = tmp_path / "data" / "jobs.sqlite3"
    if loss == "rows deleted":
        with store._db.session() as db:
            db.run("DELETE FROM jobs")
    store.close()
    if loss == "deleted":
        database.unlink()
    elif loss == "emptied":
        database.write_bytes(b"")

    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        reopened = JobStore(tmp_path / "data")
    assert_restored(reopened, before, ids)
    (line,) = [r for r in caplog.records if "restored" in r.getMessage()]
    assert line.levelno == logging.WARNING and "restored 6 job(s)" in line.getMessage()
    reopened.close()
    caplog.clear()
    JobStore(tmp_path / "data").close()  # a table with jobs is left as it is
    assert not [r for r in caplog.records if "restored" in r.getMessage()]


@pytest.mark.parametrize(("offset", "expected"), [(4096, "malformed"), (0, "not a database")])
def test_a_corrupt_database_is_moved_aside_with_its_companions_and_rebuilt(tmp_path, caplog, rng, offset, expected):
    """Random bytes over page 2, or over the header: quick_check at start-up finds them."""
    store = JobStore(tmp_path / "data")
    ids = make_jobs(store)
    for i in range(40):  # pages enough that page 2 is part of the job table
        store.create("svd", {"padding": "x" * 500, "i": i})
    before = {name: store.get(job_id) for name, job_id in ids.items()}
    before["running"] = replace(before["running"], started=None, progress=0.0, status="queued")
    store.close()
    database = tmp_path / "data" / "jobs.sqlite3"
    corrupt(database, offset, 4096 if offset else 100, rng)
    damaged = database.read_bytes()

    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        reopened = JobStore(tmp_path / "data")
    assert_restored(reopened, before, ids)
    assert len(reopened.page(limit=100)[0]) == 46
    (aside,) = (tmp_path / "data").glob("jobs.sqlite3.corrupt-*[0-9Z]")
    assert aside.read_bytes() == damaged
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and expected in errors[0].getMessage() and str(aside) in errors[0].getMessage()
    assert any("restored 46 job(s)" in r.getMessage() for r in caplog.records)
    reopened.close()


def test_the_wal_and_shm_files_go_aside_with_a_corrupt_database(tmp_path, rng):
    """Checked read-only: closing the check neither replays nor deletes the WAL."""
    store = JobStore(tmp_path / "data")
    job, _ = store.create("svd", {})
    store.close()
    database = tmp_path / "data" / "jobs.sqlite3"
    corrupt(database, 0, 100, rng)
    Path(f"{database}-wal").write_bytes(b"stale wal")
    Path(f"{database}-shm").write_bytes(b"stale shm")
    reopened = JobStore(tmp_path / "data")
    assert [j.id for j in reopened.page()[0]] == [job.id]
    reopened.close()
    (aside,) = (tmp_path / "data").glob("jobs.sqlite3.corrupt-*[0-9Z]")
    assert Path(f"{aside}-wal").read_bytes() == b"stale wal" and Path(f"{aside}-shm").exists()


def test_folders_without_a_record_are_logged_and_purged_after_the_retention_period(tmp_path, caplog):
    store = JobStore(tmp_path / "data")
    kept, _ = store.create("svd", {})
    store.close()
    (tmp_path / "data" / "jobs.sqlite3").unlink()
    legacy = store.jobs_dir / ("ab" * 16)  # a folder from before job.json
    (legacy / "input").mkdir(parents=True)
    (store.jobs_dir / "notes").mkdir()  # not a job's folder: never touched
    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        reopened = JobStore(tmp_path / "data")
    assert reopened.get(kept.id) is not None and reopened.get(legacy.name) is None
    assert any(
        f"1 job folder(s) in {store.jobs_dir} have no readable job.json ({legacy.name})" in r.getMessage()
        for r in caplog.records
    )
    assert reopened.purge(older_than_s=3600) == 0 and legacy.is_dir()
    long_ago = time.time() - 7200
    for folder in (legacy, store.jobs_dir / kept.id, store.jobs_dir / "notes"):
        os.utime(folder, (long_ago, long_ago))
    reopened.purge(older_than_s=3600)
    assert not legacy.exists() and (store.jobs_dir / kept.id).is_dir() and (store.jobs_dir / "notes").is_dir()
    reopened.close()


def test_a_run_cut_off_mid_write_leaves_no_result_folder_whatever_the_next_attempt_does(store):
    """Found by the replica soak: a run killed while writing its results leaves result-1/;
    the next attempt's end, failed as much as succeeded, removes it."""
    for end in ("fail", "succeed", "cancel"):
        job, _ = store.create("svd", {"end": end})
        first = store.claim_next()
        left = store.result_dir(first)
        left.mkdir(parents=True)
        (left / "s.npy").write_bytes(b"half")
        (left / ".u.npy.partial").write_bytes(b"half")
        store.recover()  # its replica is gone: back in the queue
        second = store.claim_next()
        assert second.attempt == 2
        if end == "fail":
            assert store.fail(second, "ValueError: no")
        elif end == "succeed":
            store.result_dir(second).mkdir()
            assert store.succeed(second, {})
        else:
            store.cancel(job.id)
            assert store.mark_canceled(second)
        folders = sorted(p.name for p in (store.jobs_dir / job.id).iterdir() if p.name.startswith("result"))
        assert folders == (["result-2"] if end == "succeed" else []), end


# ------------------------------------------------------------- reconcile --

RETENTION_S = 7 * 86400.0


def delete_row(store: JobStore, job_id: str) -> None:
    """A row lost as with a corrupted WAL tail: its folder stays."""
    with store._db.session(write=True) as db:
        db.run("DELETE FROM jobs WHERE id = ?", (job_id,))


def test_reconcile_gives_a_folder_its_lost_row_back(store, caplog):
    """The issue's case: 24 job folders, 23 rows; the 24th, whose job.json says succeeded,
    answered 404. A running job's lost row comes back queued; a folder a submission in
    progress owns, and a job finished before the retention period, are left alone."""
    jobs = [store.create("svd", {"i": i})[0] for i in range(24)]
    succeeded = store.claim_next()
    assert store.succeed(succeeded, {"s": [1.0]})
    running = store.claim_next()
    delete_row(store, succeeded.id)
    delete_row(store, running.id)
    old, _ = store.create("svd", {"old": True})
    store.cancel(old.id)
    record = json.loads((store.jobs_dir / old.id / "job.json").read_text())
    record["finished"] = time.time() - RETENTION_S - 60  # purged meanwhile by another replica
    (store.jobs_dir / old.id / "job.json").write_text(json.dumps(record))
    delete_row(store, old.id)
    in_progress = store.jobs_dir / ("f" * 32)
    in_progress.mkdir()
    owner = create_owned(in_progress / "job.json")  # renamed into place, its row not yet inserted
    os.write(owner, json.dumps({**record, "id": "f" * 32, "finished": None, "status": "queued"}).encode())
    assert store.get(succeeded.id) is None and len(store.page(limit=100)[0]) == 22

    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        store.reconcile(RETENTION_S)
    remove_tree(in_progress)  # that submission failed: its folder goes, then its lock
    os.close(owner)
    back = store.get(succeeded.id)
    assert back.status == "succeeded" and back.result == {"s": [1.0]} and back.attempt == 1
    requeued = store.get(running.id)
    assert requeued.status == "queued" and requeued.started is None
    assert store.get(old.id) is None and store.get("f" * 32) is None
    assert len(store.page(limit=100)[0]) == 24 == len(jobs)
    assert "2 job folder(s) in" in caplog.text and "had no row in the job database" in caplog.text
    store.reconcile(RETENTION_S)  # again (another replica starting): nothing more
    assert len(store.page(limit=100)[0]) == 24


def test_reconcile_fails_a_waiting_job_whose_folder_is_gone_and_keeps_finished_records(store, caplog):
    queued, _ = store.create("svd", {"a": 1})
    running, _ = store.create("svd", {"a": 2})
    done, _ = store.create("svd", {"a": 3})
    kept, _ = store.create("svd", {"a": 4})
    assert store.claim_next().id == queued.id
    store.cancel(queued.id)  # a cancel asked for: still running until its checkpoint
    claimed = store.claim_next()
    finished = store.claim_next()
    assert store.succeed(finished, {"ok": True})
    for job in (queued, running, done):
        remove_tree(store.jobs_dir / job.id)
    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        store.reconcile(RETENTION_S)
    for job in (queued, running):
        lost = store.get(job.id)
        assert lost.status == "failed" and lost.finished is not None
        assert lost.error == f"the job's folder {store.jobs_dir / job.id} (its input files and record) is missing"
    assert store.get(done.id).status == "succeeded" and store.get(kept.id).status == "queued"
    assert "2 queued or running job(s) have no folder" in caplog.text
    assert f"1 finished job(s) have no folder in {store.jobs_dir}: their result files are gone" in caplog.text
    assert not store.succeed(claimed, {"late": True})  # its runner's end is refused: it removes its result


def test_reconcile_changes_nothing_when_no_job_folder_is_left(store, caplog):
    """No folder at all while the table has jobs: a data directory that is not this database's
    (a shared one not mounted), not lost jobs."""
    jobs = [store.create("svd", {"i": i})[0] for i in range(3)]
    for job in jobs:
        remove_tree(store.jobs_dir / job.id)
    with caplog.at_level(logging.ERROR, logger="pencil.jobs"):
        store.reconcile(RETENTION_S)
    assert [store.get(job.id).status for job in jobs] == ["queued"] * 3
    assert "holds 3 job(s) but" in caplog.text and "Nothing was changed" in caplog.text


def test_replicas_reconciling_at_once_restore_each_row_once(postgres_url, tmp_path):
    """Replicas of a shared store starting together: each lost row comes back once, each job
    without a folder fails once, and no error."""
    first = JobStore(tmp_path / "data", postgres_url, replica="a")
    lost = [first.create("svd", {"i": i})[0] for i in range(20)]
    gone = [first.create("svd", {"g": i})[0] for i in range(5)]
    for job in lost:
        delete_row(first, job.id)
    for job in gone:
        remove_tree(first.jobs_dir / job.id)
    replicas = [first, *(JobStore(tmp_path / "data", postgres_url, replica=name) for name in "bcd")]
    errors: list[BaseException] = []

    def start(store: JobStore) -> None:
        try:
            store.reconcile(RETENTION_S)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(store,)) for store in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    jobs, _ = first.page(limit=100)
    assert sorted(job.id for job in jobs) == sorted(job.id for job in lost + gone)
    assert {job.id: job.status for job in jobs} == {
        **{job.id: "queued" for job in lost},
        **{job.id: "failed" for job in gone},
    }
    for store in replicas:
        store.close()


def remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)
