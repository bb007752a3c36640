"""The shared job queue under contention: claims on PostgreSQL by several replicas at once.

    export PENCIL_TEST_DATABASE_URL=$(bash .ci/postgres.sh /tmp/pencil-pg)
    python bench/job_queue.py [--jobs 1000] [--replicas 3] [--threads 4] [--repeats 50]

For each claim statement, a fresh database is filled with --jobs queued jobs (through
JobStore.create, folders and all), then --replicas stores (one per replica, as on separate
hosts) with --threads claimers each drain it: claim, then finish at once, so the claims
themselves are what contend. Printed per variant:
- claim time as the claimer sees it (p50, p99; includes the round trip to the server),
- database time of one claim: EXPLAIN ANALYZE of the claim at a queue of --jobs,
  median of --repeats (each rolled back),
- drain time and claims a second,
- claimed twice (must be 0) and conflicts: claims that found nothing while jobs were still
  queued (a claimer that lost a race for the same row).
Variants: ours (`FOR UPDATE SKIP LOCKED`), the obvious one (`FOR UPDATE`, claimers wait on
the same row and then find it taken), and the SQLite store of one host (its one writer at a
time) for scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg import conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import percentile  # bench/ is not a package

from jobs.store import JobStore

VARIANTS = {
    "ours: FOR UPDATE SKIP LOCKED": " FOR UPDATE SKIP LOCKED",
    "anchor: FOR UPDATE": " FOR UPDATE",
}


def fresh_database(base_url: str, admin: psycopg.Connection) -> str:
    name = f"pencil_bench_{int(time.time() * 1000)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    return conninfo.make_conninfo(base_url, dbname=name)


def fill(store: JobStore, jobs: int) -> None:
    for i in range(jobs):
        store.create("svd", {"i": i})


def claim_database_ms(url: str, store: JobStore, repeats: int) -> float:
    """Server-side execution time of the claim statement, median of `repeats` (rolled back)."""
    from jobs.postgres import _placeholders

    claim, args = store.claim_statement()
    sql = _placeholders(f"EXPLAIN (ANALYZE, FORMAT JSON) {claim}")
    times = []
    with psycopg.connect(url) as db:
        for _ in range(repeats):
            plan = db.execute(sql, args).fetchone()[0][0]
            times.append(plan["Planning Time"] + plan["Execution Time"])
            db.rollback()
    return statistics.median(times)


def drain(stores: list[JobStore], threads: int, total: int) -> dict:
    """Every store's `threads` claimers claim and finish until the queue is empty."""
    claimed: list[str] = []
    latencies: list[float] = []
    conflicts = 0
    lock = threading.Lock()

    def claimer(store: JobStore) -> None:
        nonlocal conflicts
        while True:
            start = time.perf_counter()
            job = store.claim_next()
            spent = time.perf_counter() - start
            with lock:
                if job is None:
                    if len(claimed) < total:  # nothing for us, yet jobs were still queued: a lost race
                        conflicts += 1
                        continue
                    return
                claimed.append(job.id)
                latencies.append(spent * 1000)
            store.succeed(job, {})

    workers = [threading.Thread(target=claimer, args=(store,)) for store in stores for _ in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - start
    latencies.sort()
    return {
        "claims": len(claimed),
        "twice": len(claimed) - len(set(claimed)),
        "conflicts": conflicts,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "drain_s": seconds,
        "per_s": len(claimed) / seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="a server whose user may create databases [PENCIL_TEST_DATABASE_URL]")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="claimers per replica [4]")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)

    base = args.database_url or os.environ.get("PENCIL_TEST_DATABASE_URL")
    if not base:
        parser.error("give --database-url or set PENCIL_TEST_DATABASE_URL (bash .ci/postgres.sh starts a server)")
    print(f"{args.jobs} queued jobs, {args.replicas} replicas x {args.threads} claimers, each claim then finished")
    print(
        "| variant | claim p50 (ms) | claim p99 (ms) | database time (ms) | drain (s) | claims/s | twice | conflicts |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with psycopg.connect(base, autocommit=True) as admin:
        for name, skip in VARIANTS.items():
            url = fresh_database(base, admin)
            with tempfile.TemporaryDirectory() as data:
                stores = [JobStore(Path(data), url, replica=f"r{i}") for i in range(args.replicas)]
                for store in stores:
                    store._db.SKIP_LOCKED = skip  # the variant's claim (an instance attribute)
                fill(stores[0], args.jobs)
                database_ms = claim_database_ms(url, stores[0], args.repeats)
                result = drain(stores, args.threads, args.jobs)
                for store in stores:
                    store.close()
            admin.execute(f'DROP DATABASE "{conninfo.conninfo_to_dict(url)["dbname"]}" WITH (FORCE)')
            print(row(name, result, f"{database_ms:.3f}"))
    with tempfile.TemporaryDirectory() as data:
        store = JobStore(Path(data))
        fill(store, args.jobs)
        result = drain([store], args.replicas * args.threads, args.jobs)
        store.close()
        print(row("SQLite, one host (no replicas)", result, "-"))


def row(name: str, result: dict, database_ms: str) -> str:
    return (
        f"| {name} | {result['p50_ms']:.2f} | {result['p99_ms']:.2f} | {database_ms} | {result['drain_s']:.2f} | "
        f"{result['per_s']:.0f} | {result['twice']} | {result['conflicts']} |"
    )


if __name__ == "__main__":
    main()
