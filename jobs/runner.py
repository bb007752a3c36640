"""The job runner: `workers` threads take queued jobs oldest first and run them. On CUDA
each job holds one batch-priority lease of the device pool while it runs, so at most
`workers` (PENCIL_JOB_STREAMS) leases go to jobs and the pool keeps the rest, and its
priority, for /sketch. Without a GPU, jobs run on the CPU backend.

A job that raises fails with the message; one that is canceled stops at its next
checkpoint (the progress callback its front door calls). A job whose result files cannot
be written fails with "could not store the result: <reason>" and leaves no result files,
on a full disk too (the store gives up its space reserve to record it; the heartbeat makes
the reserve again once there is room).
A worker outlives errors of the store itself (logged; it tries again at its next poll).

Leases: a claim holds its job for PENCIL_JOB_LEASE_S; a heartbeat thread renews the
leases of this replica's running jobs every third of that, and puts back in the queue the
jobs of any replica whose lease ran out (it died, or stalled). A job whose lease was lost
stops at its next checkpoint and writes nothing: its end state and result are refused by
the store (fencing by attempt), and its result folder is removed.

Which process runs the jobs: one per replica, the holder of the runner lock
(jobs/leader.py); the other server processes of the replica wait on it and take over
when its holder dies. With SQLite the lock lives in the data directory and the process
taking it re-queues the jobs left running (JobStore.recover); with PostgreSQL each
replica has its own lock on local disk, and a dead replica's jobs come back through the
lease. A job submitted to another process is seen at the runner's next poll (POLL_S).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import BinaryIO, Protocol

from prometheus_client import Counter, Histogram

from gpu.jobs import FileWriter
from gpu.pool import BATCH, DevicePool
from jobs.corpora import corpus_text
from jobs.kinds import JobCanceled, JobKind
from jobs.leader import RunnerLock
from jobs.storage import StorageError, remove_tree_quietly, write_atomically
from jobs.store import DATABASE_ERRORS, Claim, Job, JobStore
from jobs.webhooks import WebhookSender

log = logging.getLogger("pencil.jobs")

POLL_S = 1.0  # a worker looks at the queue at least this often (submissions also wake it)
PURGE_EVERY_S = 3600.0
STANDBY_POLL_S = 2.0  # a process without the runner lock tries to take it this often


STORE_ERRORS: tuple[type[Exception], ...] = (*DATABASE_ERRORS, OSError)


class JobMetrics(Protocol):
    """The Prometheus metrics the runner records (app/metrics.py's Metrics has them)."""

    job_queue_wait: Histogram  # by kind: seconds from submission to start
    jobs_finished: Counter  # by kind and end state
    job_run_time: Histogram  # by kind: seconds of a run


LogContext = Callable[[str | None], AbstractContextManager[None]]


def no_log_context(request_id: str | None) -> AbstractContextManager[None]:
    """A job's log lines without a request id (the service passes app.logs.request_context)."""
    return nullcontext()


class JobLost(Exception):
    """The job's lease ended (this replica was presumed dead): it runs elsewhere now."""


class JobRunner:
    def __init__(
        self,
        store: JobStore,
        kinds: Mapping[str, JobKind],
        workers: int,
        backend: str,
        pool: DevicePool | None,
        metrics: JobMetrics,
        retention_s: float,
        job_memory_fraction: float | None = None,
        log_context: LogContext = no_log_context,
        webhooks: WebhookSender | None = None,
    ):
        """`job_memory_fraction`: the share of each card the pool may hold once this process
        runs the jobs (None: leave the pool's cap as it is). `log_context(request_id)`: the
        context a job runs in, so that its log lines carry the id of the request that
        submitted it. `webhooks`: the sender of finished jobs' webhooks, started with the
        workers in the process that runs the jobs."""
        self.log_context, self.webhooks = log_context, webhooks
        self.store, self.kinds, self.backend, self.pool, self.metrics = store, kinds, backend, pool, metrics
        self.retention_s = retention_s
        self.job_memory_fraction = job_memory_fraction
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=f"job-{i}", daemon=True) for i in range(workers)]
        self._last_purge = 0.0
        self._lock = RunnerLock(runner_lock_path(store))
        self._standby: threading.Thread | None = None
        self._heartbeat = threading.Thread(target=self._beat, name="job-heartbeat", daemon=True)
        self._running: dict[str, Job] = {}  # the claims this process runs now, by job id
        self._lost: set[tuple[str, int]] = set()  # (id, attempt) of those whose lease the heartbeat found lost
        self._running_lock = threading.Lock()

    @property
    def leading(self) -> bool:
        """Whether this process runs the jobs (holds the runner lock)."""
        return self._lock.held

    def start(self) -> None:
        """Run jobs now if no other process does, else wait in the background to take over."""
        if self._lock.try_acquire():
            self._lead()
        else:
            log.info("another server process runs the batch jobs; this one takes over if it stops")
            self._standby = threading.Thread(target=self._wait_for_lock, name="job-standby", daemon=True)
            self._standby.start()

    def _wait_for_lock(self) -> None:
        while not self._stopping.wait(STANDBY_POLL_S):
            try:
                if self._lock.try_acquire():
                    log.info("this process now runs the batch jobs")
                    self._lead()
                    return
            except Exception as exc:  # a storage fault: keep standing by rather than die silently
                log.warning("could not take over the batch jobs (%s); trying again in %.0f s", exc, STANDBY_POLL_S)

    def _lead(self) -> None:
        if self.pool is not None and self.job_memory_fraction is not None:
            self.pool.set_memory_fraction(self.job_memory_fraction)
        try:  # folders and rows back in line (a row lost with a WAL tail, a folder lost)
            self.store.reconcile(self.retention_s)
        except STORE_ERRORS as exc:  # the jobs still run; the next start tries again
            log.error("could not reconcile the job folders with the job store: %s", exc)
        if not self.store.shared:
            requeued = self.store.recover()
            if requeued:
                log.info("re-queued %d job(s) left running by a stopped process", requeued)
        self._purge()
        if self.backend == "cuda" and self.pool is not None:
            threading.Thread(target=self._load_kernels, name="job-kernels", daemon=True).start()
        self._heartbeat.start()
        for thread in self._threads:
            thread.start()
        if self.webhooks is not None:
            self.webhooks.start()

    def _load_kernels(self) -> None:
        """Every kind's CUDA kernels loaded on each device before a job asks for them: the
        image's fatbins load in milliseconds, and where there are none NVRTC compiles them
        here (tens of seconds) rather than in the first job of each kind. A job that comes
        first waits for its own source only."""
        from gpu import kernels

        assert self.pool is not None
        for device in self.pool.device_ids:
            try:
                seconds = kernels.load_all(device)
            except Exception:  # the job that needs it will say what is wrong
                log.exception("could not load the batch jobs' kernels on device %d", device)
            else:
                log.info("batch job kernels ready on device %d in %.2f s", device, seconds)

    def _beat(self) -> None:
        """Every third of the lease: renew this process's claims, and re-queue the jobs
        whose lease ran out anywhere."""
        while not self._stopping.wait(self.store.lease_s / 3):
            try:
                self.heartbeat()
            except STORE_ERRORS as exc:
                log.error("could not renew the job leases (%s); trying again in %.0f s", exc, self.store.lease_s / 3)
            except Exception:  # the heartbeat must outlive anything: without it every lease here ends
                log.exception("the job heartbeat failed; trying again in %.0f s", self.store.lease_s / 3)

    def heartbeat(self) -> None:
        """One beat (see _beat)."""
        with self._running_lock:
            running = list(self._running.values())
        for job in running:
            if self.store.renew(job) is Claim.LOST:
                with self._running_lock:
                    if self._running.get(job.id) is job:  # not a run that ended meanwhile
                        self._lost.add((job.id, job.attempt))
        requeued = self.store.requeue_expired()
        for job in requeued:
            log.warning(
                "job %s (%s) was running on replica %s whose lease ended: back in the queue",
                job.id,
                job.kind,
                job.replica,
                extra={"job_id": job.id, "kind": job.kind, "lost_replica": job.replica, "attempt": job.attempt},
            )
        if requeued:
            self.notify()
        self.store.keep_reserve()  # given up when the disk filled: made again once there is room

    def stop(self, wait_s: float = 2.0) -> bool:
        """Stop taking jobs; running ones finish on their daemon threads or, if the
        process exits first, are re-queued at the next start. Returns whether every
        worker has stopped within `wait_s` (then the store may be closed)."""
        self._stopping.set()
        with self._wake:
            self._wake.notify_all()
        if self.webhooks is not None:
            self.webhooks.stop()
        deadline = time.monotonic() + wait_s
        for thread in [*self._threads, *([self._standby] if self._standby else []), self._heartbeat]:
            if thread.is_alive() and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        stopped = not any(thread.is_alive() for thread in [*self._threads, self._heartbeat])
        if stopped:
            self._lock.release()  # a job still running keeps it until the process exits
        return stopped

    def notify(self) -> None:
        """A job was submitted: wake a worker now rather than at its next poll."""
        with self._wake:
            self._wake.notify()

    def _work(self) -> None:
        while not self._stopping.is_set():
            try:
                job = self.store.claim_next()
                if job is not None:
                    self.run(job)
                    continue
                self._purge()
            except STORE_ERRORS as exc:  # the store failed, not a job: keep the worker
                log.error("the job store failed (%s); trying again in %.0f s", exc, POLL_S)
            except Exception:  # a worker must outlive anything (a job's own errors end in its record)
                log.exception("a job worker failed; it carries on")
            with self._wake:
                self._wake.wait(POLL_S)

    def run(self, job: Job) -> None:
        """Run one claimed job to its end state; its log lines carry the request id of its submission."""
        with self._running_lock:
            self._running[job.id] = job
        try:
            with self.log_context(job.request_id):
                self._run(job)
        finally:
            with self._running_lock:
                self._running.pop(job.id, None)
                self._lost.discard((job.id, job.attempt))

    def _run(self, job: Job) -> None:
        kind = self.kinds.get(job.kind)
        queue_s = max(0.0, (job.started or time.time()) - job.created)
        self.metrics.job_queue_wait.labels(job.kind).observe(queue_s)
        fields = {"job_id": job.id, "kind": job.kind, "queue_s": round(queue_s, 3)}
        fields["attempt"] = job.attempt
        again = f" again (attempt {job.attempt}: an earlier run was lost)" if job.attempt > 1 else ""
        log.info("job %s (%s) started%s", job.id, job.kind, again, extra=fields)
        start = time.perf_counter()
        failure: Exception | None = None
        result: Mapping | None = None
        try:  # the job's own work: what it raises is its outcome
            if kind is None:
                raise RuntimeError(f"this server has no job kind {job.kind!r}")
            result = self._execute(kind, job)
            outcome = "succeeded"
        except JobCanceled:
            outcome = "canceled"
        except JobLost:
            outcome = "lost"
        except Exception as exc:  # a job's failure is its own: _log_end reports it
            failure, outcome = exc, "failed"
        status = self._record_end(job, outcome, result, failure)
        seconds = time.perf_counter() - start
        self.metrics.jobs_finished.labels(job.kind, status).inc()
        self.metrics.job_run_time.labels(job.kind).observe(seconds)
        self._log_end(job, status, seconds, failure)

    def _record_end(self, job: Job, outcome: str, result: Mapping | None, failure: Exception | None) -> str:
        """Store the end of the claim `job`; returns the status to report: the outcome,
        "lost" when the store refused it (another attempt holds the job: this run's result
        folder is removed), or "unrecorded" when the store could not be reached (the files
        stay: if the end was committed they are the result, else the lease runs out, the job
        runs again and its next end removes them)."""
        try:
            if outcome == "succeeded":
                assert result is not None
                stored = self.store.succeed(job, result)
            elif outcome == "canceled":
                stored = self.store.mark_canceled(job)
            elif outcome == "failed":
                assert failure is not None
                error = str(failure) if isinstance(failure, StorageError) else f"{type(failure).__name__}: {failure}"
                stored = self.store.fail(job, error)
            else:
                stored = False
        except STORE_ERRORS as exc:
            log.error(
                "job %s (%s): could not record its end (%s) in the job store: %s; if it was not stored, the job runs "
                "again once its lease ends",
                job.id,
                job.kind,
                outcome,
                exc,
                extra={"job_id": job.id, "kind": job.kind},
            )
            return "unrecorded"
        if not stored:
            remove_tree_quietly(self.store.result_dir(job))
            return "lost"
        return outcome

    @staticmethod
    def _log_end(job: Job, status: str, seconds: float, failure: Exception | None) -> None:
        """One line per finished job; a failure's traceback unless it is a plain ValueError,
        RuntimeError or StorageError."""
        fields = {"job_id": job.id, "kind": job.kind, "status": status, "seconds": round(seconds, 3)}
        if status == "lost":
            log.warning(
                "job %s (%s) lost its lease after %.2f s (attempt %d): another replica runs it; nothing was kept "
                "of this run",
                job.id,
                job.kind,
                seconds,
                job.attempt,
                extra=fields,
            )
            return
        if failure is None:
            log.info("job %s (%s) %s in %.2f s", job.id, job.kind, status, seconds, extra=fields)
            return
        trace = failure if not isinstance(failure, (ValueError, RuntimeError, StorageError)) else None
        fields["error"] = f"{type(failure).__name__}: {failure}"
        log.warning(
            "job %s (%s) failed in %.2f s: %s", job.id, job.kind, seconds, failure, exc_info=trace, extra=fields
        )

    def _execute(self, kind: JobKind, job: Job) -> Mapping:
        """Rehydrate the job, run its kind's front door (on a batch lease with CUDA), write
        its result files and return its JSON summary."""
        loaded = kind.load(job.params, self._input_files(job))

        def progress(fraction: float) -> None:
            try:
                claim = self.store.set_progress(job, fraction)
            except STORE_ERRORS as exc:  # the job carries on: the heartbeat and its end decide
                log.warning("job %s: could not record its progress (%s)", job.id, exc, extra={"job_id": job.id})
                claim = Claim.HELD
            with self._running_lock:
                lost = (job.id, job.attempt) in self._lost
            if claim is Claim.LOST or lost:
                raise JobLost()
            if claim is Claim.CANCEL:
                raise JobCanceled()

        if self.pool is None:
            result = kind.run(loaded, None, progress)
        else:
            result = self.pool.run(
                lambda lease: kind.run(loaded, lease, progress), priority=BATCH, timeout=365 * 24 * 3600.0
            )
        _store_results(self.store.result_dir(job), result.files)
        return result.summary

    def _input_files(self, job: Job) -> dict[str, Path]:
        """The job's stored input files by name and, for a job on a stored corpus, its text
        as `corpus`."""
        folder = self.store.input_dir(job.id)
        files = {path.name: path for path in folder.iterdir()} if folder.is_dir() else {}
        corpus_id = job.params.get("corpus_id")
        if corpus_id:
            files["corpus"] = corpus_text(self.store.data_dir, corpus_id)
        return files

    def _purge(self) -> None:
        now = time.monotonic()
        if now - self._last_purge < PURGE_EVERY_S:
            return
        self._last_purge = now
        removed = self.store.purge(self.retention_s)
        if removed:
            log.info("removed %d job(s) finished more than %.0f days ago", removed, self.retention_s / 86400)


def runner_lock_path(store: JobStore) -> Path:
    """The runner lock: in the data directory with SQLite (one host); with a shared store,
    on local disk and named by the replica, so each replica runs jobs in one process."""
    if not store.shared:
        return store.data_dir / "job-runner.lock"
    digest = hashlib.sha256(f"{store.replica}\0{store.data_dir.resolve()}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"pencil-gpu-runner-{digest}.lock"


def _store_results(folder: Path, files: Mapping[str, FileWriter]) -> None:
    """Write a job's result files into `folder` (emptied first: a run of the same attempt cut
    off by a crash may have left files). StorageError("store the result") when one cannot
    be written; the folder is removed then, so no part of the result is left."""
    try:
        remove_tree_quietly(folder)
        folder.mkdir(parents=True)
        for name, write in files.items():
            # a reader never sees a half-written file, and a failed write leaves none
            write_atomically(folder / name, _reporting_errno(write), sync_directory=False)
    except OSError as exc:
        remove_tree_quietly(folder)
        raise StorageError("store the result", exc) from exc


def _reporting_errno(write: FileWriter) -> FileWriter:
    """`write`, with an OSError that has no errno given the file's (see _with_errno)."""

    def reporting(handle: BinaryIO) -> None:
        try:
            write(handle)
        except OSError as exc:
            raise _with_errno(exc, handle.fileno()) from exc

    return reporting


def _with_errno(exc: OSError, fd: int) -> OSError:
    """`exc`, or when it has no errno (numpy reports a short write as "N requested and M
    written"), the error one more byte written at the end gets: EFBIG, ENOSPC, EDQUOT."""
    if exc.errno is not None:
        return exc
    try:
        os.write(fd, b"\0")
    except OSError as cause:
        return cause
    return exc
