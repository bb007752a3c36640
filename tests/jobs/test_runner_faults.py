"""jobs/runner.py under storage faults: a result that cannot be written (a real
file-size limit, a full disk) fails its job with a clear error and leaves no result file;
a worker outlives errors of the job store itself."""

from __future__ import annotations

import errno
import logging
import sqlite3
import time

import numpy as np

import jobs.runner as runner_module
from app.metrics import Metrics
from gpu.jobs import JobResult, npy_file
from jobs.kinds import JobKind
from jobs.runner import JobRunner
from jobs.store import JobStore
from tests.jobs.storage_faults import read_only_database, run_limited, run_on_small_disk


class Stored:
    """The job object of the test kinds: nothing to rehydrate."""

    @classmethod
    def from_json(cls, stored, files):
        return cls()


def kind(run) -> dict[str, JobKind]:
    return {"test": JobKind("test", Stored, run)}


def test_a_result_past_the_file_size_limit_fails_the_job_and_leaves_no_file(tmp_path):
    """The numpy short write ("N requested and M written", no errno) is reported as what it
    is: File too large (as ENOSPC would be: No space left on device)."""
    result = run_limited(
        """
        from pathlib import Path
        import numpy as np
        from jobs.kinds import JobKind
        from jobs.runner import JobRunner
        from jobs.store import JobStore
        from app.metrics import Metrics
        from gpu.jobs import JobResult, npy_file

        class Stored:
            @classmethod
            def from_json(cls, stored, files):
                return cls()

        def run(job, lease, progress):
            files = {"a_small.npy": npy_file(np.ones(10)), "u.npy": npy_file(np.ones((600, 600)))}
            return JobResult({"n": 1}, files)

        store = JobStore(Path("data"))
        job, _ = store.create("test", {})
        runner = JobRunner(store, {"test": JobKind("test", Stored, run)}, 1, "cpu", None, Metrics(), 3600.0)
        limit()
        runner.run(store.claim_next())
        done = store.get(job.id)
        print(json.dumps({
            "status": done.status,
            "error": done.error,
            "files": sorted(str(p.relative_to(store.jobs_dir)) for p in store.jobs_dir.rglob("*") if p.is_file()),
            "record": json.loads((store.jobs_dir / job.id / "job.json").read_text())["status"],
            "id": job.id,
        }))
        """,
        1_000_000,
        tmp_path,
    )
    assert result["status"] == "failed" and result["record"] == "failed"
    assert result["error"] == "could not store the result: File too large"
    assert result["files"] == [f"{result['id']}/job.json"]


def test_a_result_that_fills_the_disk_fails_its_job_at_once_with_its_end_recorded(tmp_path):
    """A real full disk (a small tmpfs): the result hits ENOSPC, and so would the SQLite row
    of the job's failure and its job.json; the space reserve is given up for them, so the job
    fails now with the reason instead of showing running until its lease ends and running
    again. Once there is room, the heartbeat makes the reserve again."""
    result = run_on_small_disk(
        """
        import logging
        import numpy as np
        from jobs.kinds import JobKind
        from jobs.runner import JobRunner
        from jobs.store import JobStore
        from app.metrics import Metrics
        from gpu.jobs import JobResult, npy_file

        logging.basicConfig(level=logging.WARNING)

        class Stored:
            @classmethod
            def from_json(cls, stored, files):
                return cls()

        def run(job, lease, progress):
            return JobResult({"n": 1}, {"u.npy": npy_file(np.ones((1000, 1000)))})

        store = JobStore(DISK / "data")
        reserve = (DISK / "data" / "space-reserve").exists()
        job, _ = store.create("test", {})
        claimed = store.claim_next()
        fill()  # another writer took every byte left
        runner = JobRunner(store, {"test": JobKind("test", Stored, run)}, 1, "cpu", None, Metrics(), 3600.0)
        runner.run(claimed)
        done = store.get(job.id)
        record = json.loads((store.jobs_dir / job.id / "job.json").read_text())
        after = (DISK / "data" / "space-reserve").exists()
        os.unlink(DISK / "filler")
        runner.heartbeat()
        print(json.dumps({
            "reserve": [reserve, after, (DISK / "data" / "space-reserve").exists()],
            "status": done.status,
            "error": done.error,
            "record": record["status"],
            "files": sorted(str(p.relative_to(store.jobs_dir)) for p in store.jobs_dir.rglob("*") if p.is_file()),
            "id": job.id,
        }))
        """,
        8 * 1024 * 1024,
        tmp_path,
    )
    assert result["reserve"] == [True, False, True]  # kept, given up, made again
    assert result["status"] == "failed" and result["record"] == "failed"
    assert result["error"] == "could not store the result: No space left on device"
    assert result["files"] == [f"{result['id']}/job.json"]


def test_a_full_disk_at_a_jobs_end_gives_up_the_reserve_and_records_it(tmp_path, monkeypatch, caplog):
    """Where no small disk can be mounted, the same path with SQLite's SQLITE_FULL injected:
    the first write of the end fails for want of space, the reserve goes, the second lands."""
    store = JobStore(tmp_path / "data")
    reserve = tmp_path / "data" / "space-reserve"
    assert reserve.stat().st_size == 1024 * 1024
    job, _ = store.create("test", {})
    claimed = store.claim_next()
    real_session, full = store._db.session, [True]

    def session(write=False, wait_s=None):
        if write and full[0]:
            full[0] = False
            error = sqlite3.OperationalError("database or disk is full")
            error.sqlite_errorcode = sqlite3.SQLITE_FULL
            raise error
        return real_session(write, wait_s)

    monkeypatch.setattr(store._db, "session", session)
    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        assert store.fail(claimed, "could not store the result: No space left on device")
    assert store.get(job.id).status == "failed" and not reserve.exists()
    assert "is full (database or disk is full): gave up the space reserve to record the end of job" in caplog.text
    store.keep_reserve()
    assert reserve.stat().st_size == 1024 * 1024


def test_a_full_disk_while_writing_a_result_fails_the_job_clearly_without_a_traceback(tmp_path, caplog):
    def full_disk(handle):
        handle.write(b"\x93NUMPY partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    store = JobStore(tmp_path / "data")
    job, _ = store.create("test", {})
    runner = JobRunner(
        store,
        kind(lambda job, lease, progress: JobResult({}, {"s.npy": npy_file(np.ones(3)), "u.npy": full_disk})),
        1,
        "cpu",
        None,
        Metrics(),
        3600.0,
    )
    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        runner.run(store.claim_next())
    done = store.get(job.id)
    assert (done.status, done.error) == ("failed", "could not store the result: No space left on device")
    assert not store.result_dir(done).exists()
    (line,) = [r for r in caplog.records if r.name == "pencil.jobs"]
    assert "No space left on device" in line.getMessage() and line.exc_info is None
    store.close()


def test_a_worker_outlives_errors_of_the_job_store(tmp_path, caplog, monkeypatch):
    """While its database refuses writes the worker logs and polls again; then it runs
    the job another process submitted."""
    monkeypatch.setattr(runner_module, "POLL_S", 0.05)
    store = JobStore(tmp_path / "data")
    runner = JobRunner(store, kind(lambda job, lease, progress: JobResult({"ok": True})), 1, "cpu", None, Metrics(), 1)
    runner.start()
    other_process = JobStore(tmp_path / "data")
    try:
        with caplog.at_level(logging.ERROR, logger="pencil.jobs"), read_only_database(store):
            job, _ = other_process.create("test", {})
            deadline = time.monotonic() + 10
            while not [r for r in caplog.records if "the job store failed" in r.getMessage()]:
                assert time.monotonic() < deadline, "the worker did not report the store's error"
                time.sleep(0.02)
            assert other_process.get(job.id).status == "queued"
        deadline = time.monotonic() + 10
        while other_process.get(job.id).status != "succeeded":
            assert time.monotonic() < deadline, other_process.get(job.id)
            time.sleep(0.02)
    finally:
        assert runner.stop()
        store.close()
        other_process.close()
    assert "readonly" in caplog.records[0].getMessage()


def test_a_store_error_at_a_checkpoint_does_not_fail_the_job(tmp_path, monkeypatch, caplog):
    """The job goes on (its lease, its end decide), where the error used to become the job's failure."""
    store = JobStore(tmp_path / "data")

    def run(job, lease, progress):
        progress(0.5)
        return JobResult({"n": 1}, {"u.npy": npy_file(np.ones(3))})

    job, _ = store.create("test", {})
    runner = JobRunner(store, kind(run), 1, "cpu", None, Metrics(), 3600.0)

    def locked(*args):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(store, "set_progress", locked)
    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        runner.run(store.claim_next())
    done = store.get(job.id)
    assert done.status == "succeeded" and store.result_names(done) == ["u.npy"]
    assert any("could not record its progress" in r.getMessage() for r in caplog.records)
    store.close()


def test_a_store_error_at_the_end_keeps_the_result_files(tmp_path, monkeypatch, caplog):
    """The end could not be recorded: the files stay (they are the result if the end was in
    fact committed; else the lease runs out, the job runs again and its next end removes
    them), and the run is logged, not failed."""
    store = JobStore(tmp_path / "data")

    def run(job, lease, progress):
        return JobResult({"n": 1}, {"u.npy": npy_file(np.ones(3))})

    store.create("test", {})
    claim = store.claim_next()
    runner = JobRunner(store, kind(run), 1, "cpu", None, Metrics(), 3600.0)

    def gone(*args):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "succeed", gone)
    with caplog.at_level(logging.ERROR, logger="pencil.jobs"):
        runner.run(claim)
    assert (store.result_dir(claim) / "u.npy").is_file()
    assert store.get(claim.id).status == "running"  # the lease will send it back to the queue
    assert any("could not record its end" in r.getMessage() for r in caplog.records)
    store.close()
