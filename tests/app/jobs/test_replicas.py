"""Replicas sharing one PostgreSQL job store (and one data directory): claims, leases,
fencing, cancel, idempotency and migrations, with two or more JobStore objects standing for
replicas on different hosts. Needs a real PostgreSQL server (tests/conftest.py)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pencil_testkit import admin_client, assert_api_error, wait_for_job

from app.metrics import Metrics
from gpu.jobs import JobResult, npy_file
from jobs.kinds import JobKind
from jobs.runner import JobRunner, runner_lock_path
from jobs.storage import StartupError
from jobs.store import Claim, JobStore

psycopg = pytest.importorskip("psycopg", reason="the `postgres` extra is not installed")  # CI installs it
conninfo = psycopg.conninfo

LEASE_S = 1.0


@pytest.fixture
def replicas(postgres_url, tmp_path):
    """Three stores on one database and one data directory, named r0, r1, r2."""
    stores = [JobStore(tmp_path / "data", postgres_url, replica=f"r{i}", lease_s=LEASE_S) for i in range(3)]
    yield stores
    for store in stores:
        store.close()


def test_concurrent_claims_take_every_job_exactly_once(replicas):
    ids = {replicas[i % 3].create("svd", {"i": i})[0].id for i in range(300)}
    claimed: list[tuple[str, str]] = []
    lock = threading.Lock()

    def drain(store: JobStore) -> None:
        while (job := store.claim_next()) is not None:
            with lock:
                claimed.append((job.id, job.replica))

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(drain, [replicas[i % 3] for i in range(12)]))
    assert sorted(job_id for job_id, _ in claimed) == sorted(ids)  # each once, none lost
    assert {replica for _, replica in claimed} == {"r0", "r1", "r2"}
    assert all(job.attempt == 1 for job in replicas[0].page(status="running", limit=500)[0])


def test_a_dead_replicas_job_goes_back_to_the_queue_and_its_late_writes_are_refused(replicas):
    dead, survivor, _ = replicas
    job, _ = dead.create("svd", {"m": 3})
    first = dead.claim_next()
    assert (first.attempt, first.replica) == (1, "r0")
    assert survivor.requeue_expired() == []  # the lease still holds
    time.sleep(LEASE_S + 0.2)
    (lost,) = survivor.requeue_expired()
    assert (lost.id, lost.replica) == (job.id, "r0")
    assert survivor.get(job.id).status == "queued"
    second = survivor.claim_next()
    assert (second.id, second.attempt, second.replica) == (job.id, 2, "r1")

    # The presumed-dead replica wakes up: nothing it writes counts.
    assert dead.set_progress(first, 0.9) is Claim.LOST
    assert dead.renew(first) is Claim.LOST
    stale = dead.result_dir(first)
    stale.mkdir(parents=True)
    (stale / "s.npy").write_bytes(b"stale")
    assert not dead.succeed(first, {"from": "the dead"})
    assert not dead.fail(first, "late failure")
    assert survivor.get(job.id).status == "running"

    fresh = survivor.result_dir(second)
    fresh.mkdir(parents=True)
    (fresh / "s.npy").write_bytes(b"fresh")
    assert survivor.succeed(second, {"from": "the survivor"})
    done = dead.get(job.id)
    assert (done.status, done.result, done.attempt) == ("succeeded", {"from": "the survivor"}, 2)
    assert dead.result_file(done, "s.npy")[0].read_bytes() == b"fresh"  # any replica serves the same file
    assert not stale.exists()  # the earlier attempt's folder went with the success
    assert not dead.succeed(first, {"from": "the dead, again"})
    assert dead.get(job.id).result == {"from": "the survivor"}


def test_renewed_leases_are_kept(replicas):
    runner_store, other, _ = replicas
    runner_store.create("svd", {})
    job = runner_store.claim_next()
    for _ in range(5):
        time.sleep(LEASE_S / 3)
        assert runner_store.renew(job) is Claim.HELD
        assert other.requeue_expired() == []
    assert runner_store.set_progress(job, 0.5) is Claim.HELD
    assert runner_store.succeed(job, {"ok": True})


def test_cancel_reaches_the_replica_running_the_job(replicas):
    running_on, api, _ = replicas
    job, _ = api.create("svd", {})
    claim = running_on.claim_next()
    assert api.cancel(job.id).cancel_requested
    assert running_on.renew(claim) is Claim.CANCEL
    assert running_on.set_progress(claim, 0.2) is Claim.CANCEL
    assert running_on.mark_canceled(claim)
    assert api.get(job.id).status == "canceled"


def test_an_expired_job_with_a_cancel_asked_ends_canceled(replicas):
    dead, survivor, _ = replicas
    job, _ = dead.create("svd", {})
    dead.claim_next()
    survivor.cancel(job.id)
    time.sleep(LEASE_S + 0.2)
    assert [j.id for j in survivor.requeue_expired()] == [job.id]
    after = survivor.get(job.id)
    assert (after.status, after.error) == ("canceled", "canceled while running")
    assert survivor.claim_next() is None


def test_one_idempotency_key_sent_to_every_replica_at_once_makes_one_job(replicas):
    def submit(store: JobStore):
        return store.create("svd", {"m": 4}, {"matrix.npy": b"abc"}, idempotency_key="same", request_digest="d")

    with ThreadPoolExecutor(9) as pool:
        answers = list(pool.map(submit, [replicas[i % 3] for i in range(9)]))
    assert len({job.id for job, _ in answers}) == 1
    assert sum(created for _, created in answers) == 1
    (job,) = replicas[0].page()[0]
    assert (replicas[1].input_dir(job.id) / "matrix.npy").read_bytes() == b"abc"
    assert [p.name for p in replicas[0].jobs_dir.iterdir()] == [job.id]  # the losers' folders are gone


def test_replicas_starting_together_migrate_once(postgres_url, tmp_path):
    def start(i: int) -> JobStore:
        return JobStore(tmp_path / "data", postgres_url, replica=f"s{i}")

    with ThreadPoolExecutor(6) as pool:
        stores = list(pool.map(start, range(6)))
    with psycopg.connect(postgres_url) as db:
        versions = db.execute("SELECT version FROM pencil_schema ORDER BY version").fetchall()
    assert versions == [(1,), (2,)]  # every migration, once
    job, _ = stores[0].create("svd", {})
    assert stores[5].get(job.id) == job
    for store in stores:
        store.close()


def test_retention_and_listing_see_every_replicas_jobs(replicas):
    a, b, c = replicas
    ids = [store.create("svd", {"i": i})[0].id for i, store in enumerate(replicas)]
    assert [job.id for job in c.page()[0]] == ids[::-1]
    a.fail(a.claim_next(), "ValueError: x")
    time.sleep(0.05)
    assert b.purge(older_than_s=0.01) == 1
    assert a.get(ids[0]) is None and not (a.jobs_dir / ids[0]).exists()
    assert c.counts() == {("svd", "queued"): 2}


def test_an_unreachable_database_is_a_startup_error_without_the_password(tmp_path):
    with pytest.raises(StartupError) as caught:
        JobStore(tmp_path / "data", "postgresql://pencil:hunter2@127.0.0.1:1/pencil?connect_timeout=2")
    message = str(caught.value)
    assert "postgresql://pencil:***@127.0.0.1:1/pencil" in message and "hunter2" not in message
    assert "PENCIL_DATABASE_URL" in message


# ------------------------------------------------------------------ runner --


class _Stored:
    def to_json(self):
        return {}

    def input_files(self):
        return {}

    @classmethod
    def from_json(cls, stored, files):
        return cls()


def test_a_runner_that_lost_its_lease_stops_and_keeps_nothing(replicas, caplog):
    """The job's lease is taken over while it runs (its replica stalled): at its next
    checkpoint the run stops, writes no result and leaves the job to the new attempt."""
    stalled, survivor, _ = replicas
    taken_over = threading.Event()

    def run(job, lease, progress):
        progress(0.1)
        time.sleep(LEASE_S + 0.2)  # a stall longer than the lease, with no heartbeat running
        (requeued,) = survivor.requeue_expired()
        assert survivor.claim_next().attempt == 2
        taken_over.set()
        progress(0.5)  # raises: the lease is lost
        return JobResult({"never": "stored"}, {"u.npy": npy_file(np.ones(4))})

    kind = JobKind("test", _Stored, run)
    job, _ = stalled.create("test", {})
    runner = JobRunner(stalled, {"test": kind}, 1, "cpu", None, Metrics(), 3600.0)
    claim = stalled.claim_next()
    with caplog.at_level(logging.WARNING, logger="pencil.jobs"):
        runner.run(claim)
    assert taken_over.is_set()
    now = survivor.get(job.id)
    assert (now.status, now.attempt, now.replica, now.result) == ("running", 2, "r1", None)
    assert not stalled.result_dir(claim).exists()
    (line,) = [r for r in caplog.records if "lost its lease" in r.getMessage()]
    assert line.levelno == logging.WARNING and "another replica runs it" in line.getMessage()


def test_the_heartbeat_keeps_a_long_job_and_requeues_a_dead_replicas(replicas):
    """A job running for several lease periods keeps its lease through the heartbeat, while
    the same heartbeat puts a dead replica's job back in the queue."""
    alive, dead, _ = replicas
    dead.create("svd", {"orphan": True})
    orphan = dead.claim_next()
    release = threading.Event()

    def run(job, lease, progress):
        release.wait(10)
        return JobResult({"done": True}, {})

    kind = JobKind("test", _Stored, run)
    job, _ = alive.create("test", {})
    runner = JobRunner(alive, {"test": kind}, 1, "cpu", None, Metrics(), 3600.0)
    claim = alive.claim_next()
    worker = threading.Thread(target=runner.run, args=(claim,))
    worker.start()
    deadline = time.monotonic() + 3 * LEASE_S
    while time.monotonic() < deadline:
        runner.heartbeat()
        time.sleep(LEASE_S / 3)
    release.set()
    worker.join(10)
    assert alive.get(job.id).status == "succeeded"
    requeued = alive.get(orphan.id)
    assert (requeued.status, requeued.replica) == ("queued", None)


# --------------------------------------------------------------------- API --


def test_the_api_runs_jobs_on_postgresql_and_answers_503_while_it_is_unreachable(
    make_client, postgres_url, monkeypatch
):
    monkeypatch.setattr("jobs.postgres.POOL_TIMEOUT_S", 1.0)  # each request below waits this long for nothing
    client = admin_client(make_client, "replica-token", database_url=postgres_url, replica_id="api-0")
    health = client.get("/healthz").json()
    assert (health["job_database"], health["replica"]) == ("PostgreSQL", "api-0")
    response = client.post("/jobs/svd", json={"spec": {"m": 12, "n": 8}})
    assert response.status_code == 202, response.text
    done = wait_for_job(client, response.json()["id"])
    assert (done["status"], done["attempt"], done["replica"]) == ("succeeded", 1, "api-0")
    assert client.get(done["result_url"]).status_code == 200

    name = psycopg.conninfo.conninfo_to_dict(postgres_url)["dbname"]
    maintenance = conninfo.make_conninfo(postgres_url, dbname="postgres")
    with psycopg.connect(maintenance, autocommit=True) as admin:  # the database goes away under the server
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
    try:
        for answer in (
            client.get(f"/jobs/{done['id']}"),
            client.get("/jobs"),
            client.post("/jobs/svd", json={"spec": {"m": 4, "n": 4}}),
        ):
            assert_api_error(answer, 503, "database_unavailable")
            assert int(answer.headers["retry-after"]) > 0
        asked = time.monotonic()
        ready = client.get("/readyz")
        assert time.monotonic() - asked < 0.9  # the probe waits PROBE_WAIT_S, not the pool's 1 s
        assert ready.status_code == 503 and "job database" in " ".join(ready.json()["problems"])
        assert client.get("/metrics").status_code == 200  # the job gauges keep their last values
    finally:
        with psycopg.connect(maintenance, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    deadline = time.monotonic() + 20  # the pool reconnects (its retries back off from 1 s)
    while (back := client.get(f"/jobs/{done['id']}")).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert back.status_code == 200 and back.json()["status"] == "succeeded"


def test_each_replica_has_its_own_runner_lock_on_local_disk(replicas, postgres_url, tmp_path):
    """With a shared store the runner lock cannot live in the shared directory (one process
    of the whole cluster would run jobs, and flock over NFS is unreliable): one per replica,
    shared by that replica's processes."""
    r0, r1, _ = replicas
    another_process_of_r0 = JobStore(r0.data_dir, postgres_url, replica="r0")
    assert runner_lock_path(another_process_of_r0) == runner_lock_path(r0) != runner_lock_path(r1)
    assert runner_lock_path(r0).parent != r0.data_dir
    another_process_of_r0.close()
    single_host = JobStore(tmp_path / "single")
    assert runner_lock_path(single_host) == tmp_path / "single" / "job-runner.lock"
    single_host.close()
