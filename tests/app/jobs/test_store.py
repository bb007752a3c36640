"""app/jobs/store.py: the SQLite job store: states and their transitions, inputs stored
before the row, idempotency, cancel, recovery after a stop, paging, retention."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from app.jobs.store import IdempotencyConflict, JobStore


@pytest.fixture
def store(tmp_path):
    store = JobStore(tmp_path / "data")
    yield store
    store.close()


def test_a_job_goes_queued_running_succeeded(store):
    job, created = store.create("svd", {"m": 3}, {"matrix.npy": b"abc"})
    assert created and job.status == "queued" and job.params == {"m": 3} and job.progress == 0
    assert (store.input_dir(job.id) / "matrix.npy").read_bytes() == b"abc"
    running = store.claim_next()
    assert running.id == job.id and running.status == "running" and running.started >= job.created
    assert store.claim_next() is None
    assert store.set_progress(job.id, 0.5)
    assert store.get(job.id).progress == 0.5
    store.succeed(job.id, {"values": [1.0, 2.0]})
    done = store.get(job.id)
    assert (done.status, done.progress, done.result) == ("succeeded", 1.0, {"values": [1.0, 2.0]})
    assert done.finished >= done.started and done.is_finished


def test_non_finite_numbers_in_a_result_are_stored_as_null(store):
    """JSON has no NaN or infinity: a result holding them (an overflowed product, say) is
    stored with null there, so the API can always send it."""
    job, _ = store.create("cs256", {}, {})
    store.claim_next()
    store.succeed(
        job.id,
        {"error": float("inf"), "nested": {"values": [1.5, float("nan"), -float("inf")], "pair": (2.0, 3)}, "ok": 0.25},
    )
    assert store.get(job.id).result == {
        "error": None,
        "nested": {"values": [1.5, None, None], "pair": [2.0, 3]},
        "ok": 0.25,
    }


def test_failure_keeps_the_message(store):
    job, _ = store.create("svd", {})
    store.claim_next()
    store.fail(job.id, "ValueError: no")
    assert (store.get(job.id).status, store.get(job.id).error) == ("failed", "ValueError: no")


def test_jobs_are_claimed_oldest_first(store):
    ids = [store.create("svd", {"i": i})[0].id for i in range(3)]
    assert [store.claim_next().id for _ in ids] == ids


def test_the_database_is_in_wal_mode(store):
    mode = sqlite3.connect(store.data_dir / "jobs.sqlite3").execute("PRAGMA journal_mode").fetchone()[0]
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
    assert store.claim_next().id == queued.id  # the older one runs
    store.cancel(running.id)  # still queued: canceled now
    assert store.get(running.id).status == "canceled"
    after = store.cancel(queued.id)
    assert after.status == "running" and after.cancel_requested
    assert store.set_progress(queued.id, 0.3) is False  # the checkpoint sees the request
    store.mark_canceled(queued.id)
    assert store.get(queued.id).status == "canceled"
    assert store.cancel("nope") is None


def test_finishing_is_refused_for_a_job_that_is_not_running(store):
    job, _ = store.create("svd", {})
    store.cancel(job.id)
    store.succeed(job.id, {"late": True})  # a runner that lost a race must not resurrect it
    assert store.get(job.id).status == "canceled"


def test_recover_requeues_running_jobs_and_honours_cancels(tmp_path):
    store = JobStore(tmp_path / "data")
    left_running, _ = store.create("svd", {"a": 1})
    canceled_meanwhile, _ = store.create("svd", {"a": 2})
    waiting, _ = store.create("svd", {"a": 3})
    store.claim_next()
    store.claim_next()
    store.cancel(canceled_meanwhile.id)
    (store.jobs_dir / ".cut-off.partial" / "input").mkdir(parents=True)  # a submission cut off mid-write
    two_hours_ago = time.time() - 7200
    os.utime(store.jobs_dir / ".cut-off.partial", (two_hours_ago, two_hours_ago))
    (store.jobs_dir / ".in-progress.partial").mkdir()  # another process's submission, being written now
    store.close()

    reopened = JobStore(tmp_path / "data")
    assert reopened.recover() == 1
    assert reopened.get(left_running.id).status == "queued" and reopened.get(left_running.id).started is None
    assert reopened.get(canceled_meanwhile.id).status == "canceled"
    assert reopened.get(waiting.id).status == "queued"
    assert [p.name for p in reopened.jobs_dir.glob(".*.partial")] == [".in-progress.partial"]
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
    store.result_dir(job.id).mkdir(parents=True)
    (store.result_dir(job.id) / "s.npy").write_bytes(b"x")
    assert store.result_file(job.id, "s.npy").read_bytes() == b"x"
    for name in ("../input", "..", "../../jobs.sqlite3", "missing.npy", "/etc/passwd"):
        assert store.result_file(job.id, name) is None


def test_purge_removes_old_finished_jobs_and_their_files(store):
    old, _ = store.create("svd", {}, {"matrix.npy": b"1"})
    store.claim_next()
    store.fail(old.id, "x")
    fresh, _ = store.create("svd", {})
    time.sleep(0.05)
    assert store.purge(older_than_s=0.01) == 1
    assert store.get(old.id) is None and not (store.jobs_dir / old.id).exists()
    assert store.get(fresh.id) is not None  # queued jobs are never purged
