"""`pencil-gpu serve` with PENCIL_PROCESSES=2: both processes draw, exactly one runs the
batch jobs, and when that one is killed the other takes the jobs over, the running one
included, so each job still ends with one result."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pencil_testkit import decoded, free_port, photo_bytes, server_env, server_process, sketch_files

TOKEN = "processes-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def two_processes(tmp_path: Path):
    port = free_port()
    env = server_env(tmp_path, processes="2", port=str(port), admin_token=TOKEN, log_level="info")
    base = f"http://127.0.0.1:{port}"
    with server_process(
        [sys.executable, "-m", "app.cli", "serve"], tmp_path, env, base, ready_path="/readyz", startup_timeout_s=90
    ) as server:
        yield base, tmp_path / "server.log", server, env


def health_by_pid(base: str, want: int, timeout_s: float = 30) -> dict[int, dict]:
    """/healthz bodies by process id, until `want` processes have answered (new
    connections land on either process)."""
    seen: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < want:
        assert time.monotonic() < deadline, f"only processes {sorted(seen)} answered"
        try:
            with httpx.Client(base_url=base, timeout=5) as client:  # a new connection each time
                body = client.get("/healthz").json()
        except httpx.TransportError:  # a connection queued on a process just killed: try again
            time.sleep(0.05)
            continue
        seen[body["pid"]] = body
    return seen


def leader_pid(base: str, timeout_s: float = 30, not_pid: int | None = None) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        for pid, body in health_by_pid(base, 1).items():
            if body["runs_jobs"] and pid != not_pid:
                return pid
        assert time.monotonic() < deadline, "no process runs the jobs"
        time.sleep(0.05)


def test_both_processes_draw_and_one_runs_the_jobs(two_processes):
    base, *_ = two_processes
    bodies = health_by_pid(base, 2)
    assert all(body["processes"] == 2 for body in bodies.values())
    assert sum(body["runs_jobs"] for body in bodies.values()) == 1, bodies
    upload = photo_bytes("coffee", "jpeg", 160)
    for _ in range(4):
        with httpx.Client(base_url=base, timeout=60) as client:
            response = client.post("/sketch", files=sketch_files(upload), data={"format": "png"})
        assert response.status_code == 200, response.text
        assert decoded(response.content).shape == (107, 160)


def test_a_killed_job_runner_hands_its_jobs_over(two_processes):
    base, log_path, *_ = two_processes
    health_by_pid(base, 2)  # both serve: the survivor is listening when the leader dies
    first_leader = leader_pid(base)
    with httpx.Client(base_url=base, timeout=30, headers=AUTH) as client:
        # About 10 s of LAPACK on two cores: long enough to be killed while running.
        slow = client.post(
            "/jobs/svd",
            json={
                "spec": {"m": 2600, "n": 2600, "dtype": "float64", "seed": 3, "kind": "gaussian"},
                "method": "lapack",
            },
        )
        assert slow.status_code == 202, slow.text
        quick = [
            client.post(
                "/jobs/svd", json={"spec": {"m": 40, "n": 30, "dtype": "float64", "seed": s, "kind": "gaussian"}}
            )
            for s in range(4)
        ]
        ids = [slow.json()["id"]] + [r.json()["id"] for r in quick]
        deadline = time.monotonic() + 30
        while client.get(f"/jobs/{ids[0]}").json()["status"] != "running":
            assert time.monotonic() < deadline, "the slow job never started"
            time.sleep(0.05)
    os.kill(first_leader, signal.SIGKILL)

    second_leader = leader_pid(base, timeout_s=60, not_pid=first_leader)
    assert second_leader != first_leader
    with httpx.Client(base_url=base, timeout=30, headers=AUTH) as client:
        deadline = time.monotonic() + 240
        while True:
            statuses = [client.get(f"/jobs/{job_id}").json()["status"] for job_id in ids]
            if all(status in ("succeeded", "failed", "canceled") for status in statuses):
                break
            assert time.monotonic() < deadline, statuses
            time.sleep(0.2)
        assert statuses == ["succeeded"] * len(ids)
        result = client.get(f"/jobs/{ids[0]}/result").json()["result"]
        assert result["singular_values_count"] == 2600
    # The slow job, and a quick one if the second job thread had one: re-queued, then run.
    assert re.search(r"re-queued [12] job\(s\) left running by a stopped process", log_path.read_text())


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_second_server_on_the_same_port_is_refused(two_processes, tmp_path):
    _, _, _, env = two_processes
    second = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve"],
        cwd=tmp_path,
        env={**env, "PENCIL_DATA_DIR": str(tmp_path / "other")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2
    assert "cannot serve on" in second.stderr


def test_the_second_process_starts_once_the_first_serves(two_processes):
    """Warm-ups side by side would delay the first process to be ready (app/serve.py)."""
    base, log_path, _, _ = two_processes
    pids = set(health_by_pid(base, 2))
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    serves = [i for i, line in enumerate(lines) if re.fullmatch(r"server process \d+ serves after .*", line["message"])]
    assert len(serves) == 1, [line["message"] for line in lines]
    first = int(lines[serves[0]]["message"].split()[2])
    (second,) = pids - {first}
    first_lines = [i for i, line in enumerate(lines) if line.get("pid") == first]
    assert any(lines[i]["message"] == "Application startup complete." for i in first_lines if i < serves[0])
    assert min(i for i, line in enumerate(lines) if line.get("pid") == second) > serves[0]


def test_the_processes_stop_when_their_supervisor_is_killed(two_processes):
    base, _, server, _ = two_processes
    children = list(health_by_pid(base, 2))
    os.kill(server.pid, signal.SIGKILL)
    server.wait(timeout=10)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in children):
        assert time.monotonic() < deadline, f"processes {[p for p in children if alive(p)]} outlived their supervisor"
        time.sleep(0.1)


def test_processes_dying_at_start_end_the_server_instead_of_looping(tmp_path):
    not_a_directory = tmp_path / "data"
    not_a_directory.write_text("a file where the data directory should be")
    # with batch jobs on: only they use the data directory
    env = server_env(tmp_path, processes="2", port=str(free_port()), data_dir=str(not_a_directory), admin_token=TOKEN)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "giving up" in result.stderr
    assert time.monotonic() - started < 90


def test_the_open_file_limit_is_raised_for_the_connection_cap_or_the_cap_lowered(monkeypatch, caplog):
    import resource

    from app.serve import FILES_BESIDE_CONNECTIONS, open_files_for

    limits = {"soft": 1024, "hard": 4096}
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: limits.update(soft=value[0]))
    assert open_files_for(1000) == 1000 and limits["soft"] == 1000 + FILES_BESIDE_CONNECTIONS  # raised
    assert open_files_for(10_000) == 4096 - FILES_BESIDE_CONNECTIONS and limits["soft"] == 4096  # the hard limit
    assert "PENCIL_MAX_CONNECTIONS=10000 does not fit this process's limit of 4096 open files" in caplog.text
