"""A soak of the whole server (CPU backend, two processes, jobs on) within CI's time:
small sketches beside huge images, stalled uploads, batch jobs, a job-runner process
killed (-9) and the whole server killed and started again on the same data directory.

Asserted: no answer is a 5xx; every job a 202 accepted finishes succeeded after the
restarts; every server process's memory stays within what the settings allow; a small
photo keeps being served while huge ones render.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from pencil_testkit import encode, free_port, photo_bytes, server_env, server_process

TOKEN = "soak-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PHASE_S = 12.0
HUGE_SIDE = 2400  # 5.8 MP: a few seconds of CPU rendering each
MAX_CONCURRENT_PIXELS = 8_000_000
BYTES_PER_PIXEL = 60  # the CPU backend's peak working set per pixel (README, PENCIL_MAX_CONCURRENT_PIXELS)
BASELINE_RSS = 450 * 2**20  # a warmed-up server process (measured about 380 MiB): Python, NumPy, OpenCV, the texture
SETTINGS = {
    "admin_token": TOKEN,
    "processes": "2",
    "workers": "2",
    "max_queue": "64",
    "max_concurrent_pixels": str(MAX_CONCURRENT_PIXELS),
    "large_render_pixels": "2000000",
    "upload_timeout_s": "2",
    "log_format": "text",
}


class Load:
    """Clients of one phase: each records the statuses it got; `stop` ends them."""

    def __init__(self, base: str):
        self.base, self.stop = base, threading.Event()
        self.statuses: Counter[int] = Counter()
        self.transport_errors = 0
        self.huge_served = 0
        self.accepted_jobs: list[str] = []
        self.small_latency_ms: list[float] = []
        self.lock = threading.Lock()
        small = photo_bytes("coffee", "jpeg", 320)
        huge = encode(np.full((HUGE_SIDE, HUGE_SIDE, 3), 180, np.uint8), "png")
        self.threads = [
            threading.Thread(target=self._sketches, args=(small, True), daemon=True),
            threading.Thread(target=self._sketches, args=(small, True), daemon=True),
            threading.Thread(target=self._sketches, args=(huge, False), daemon=True),
            threading.Thread(target=self._sketches, args=(huge, False), daemon=True),  # two: more than the budget
            threading.Thread(target=self._stalled_uploads, daemon=True),
            threading.Thread(target=self._jobs, daemon=True),
        ]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def _record(self, status: int | None) -> None:
        with self.lock:
            if status is None:
                self.transport_errors += 1
            else:
                self.statuses[status] += 1

    def _sketches(self, image: bytes, small: bool) -> None:
        files = {"image": ("p.png" if not small else "p.jpg", image, "image/png" if not small else "image/jpeg")}
        with httpx.Client(base_url=self.base, timeout=120) as client:
            while not self.stop.is_set():
                start = time.perf_counter()
                try:
                    status = client.post("/sketch", files=files, data={"format": "jpeg"}).status_code
                except httpx.TransportError:
                    status = None
                    time.sleep(0.2)
                self._record(status)
                if status == 200:
                    with self.lock:
                        if small:
                            self.small_latency_ms.append((time.perf_counter() - start) * 1000)
                        else:
                            self.huge_served += 1

    def _stalled_uploads(self) -> None:
        """An upload that sends its headers and 10 bytes of a 100 kB body, then nothing."""
        host, port = self.base.removeprefix("http://").split(":")
        while not self.stop.is_set():
            try:
                with socket.create_connection((host, int(port)), timeout=15) as sock:
                    head = (
                        f"POST /sketch HTTP/1.1\r\nHost: {host}\r\nContent-Type: image/jpeg\r\nContent-Length: "
                        "100000\r\n\r\n"
                    )
                    sock.sendall(head.encode() + b"\xff\xd8" + b"0" * 8)
                    answer = sock.recv(64)
                status = int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else None
            except OSError:
                status = None
            self._record(status)

    def _jobs(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30, headers=AUTH) as client:
            seed = 0
            while not self.stop.is_set():
                seed += 1
                body = {"spec": {"m": 60, "n": 40, "seed": seed}, "method": "lapack"}
                try:
                    response = client.post("/jobs/svd", json=body)
                except httpx.TransportError:
                    self._record(None)
                    time.sleep(0.2)
                    continue
                self._record(response.status_code)
                if response.status_code == 202:
                    with self.lock:
                        self.accepted_jobs.append(response.json()["id"])
                time.sleep(0.3)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def leader_pid(base: str) -> int:
    """The server process that runs the batch jobs (asked until one of the two answers)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            body = httpx.get(f"{base}/healthz", timeout=5).json()
        except httpx.TransportError:
            continue
        if body["runs_jobs"]:
            return body["pid"]
    raise AssertionError("no server process runs the jobs")


def watch_memory(supervisor: int, peak: dict[int, int], stop: threading.Event) -> None:
    while not stop.wait(0.2):
        for pid in children(supervisor):
            peak[pid] = max(peak.get(pid, 0), rss_bytes(pid))


def run_load(base: str, supervisor: int, peak: dict[int, int], kill_leader: bool) -> Load:
    """One phase of load against a running server, its processes' memory watched."""
    stop_watch = threading.Event()
    watcher = threading.Thread(target=watch_memory, args=(supervisor, peak, stop_watch), daemon=True)
    watcher.start()
    with Load(base) as load:
        time.sleep(PHASE_S / 2)
        if kill_leader:
            os.kill(leader_pid(base), signal.SIGKILL)  # the supervisor starts another; the jobs are taken over
        time.sleep(PHASE_S / 2)
    stop_watch.set()
    watcher.join()
    return load


def wait_until_all_succeeded(base: str, jobs: list[str], timeout_s: float = 120) -> None:
    with httpx.Client(base_url=base, timeout=30, headers=AUTH) as client:
        deadline = time.monotonic() + timeout_s
        pending = set(jobs)
        while pending and time.monotonic() < deadline:
            for job_id in sorted(pending):
                response = client.get(f"/jobs/{job_id}")
                assert response.status_code == 200, f"job {job_id} lost: {response.text}"
                status = response.json()["status"]
                if status in ("succeeded", "failed", "canceled"):
                    assert status == "succeeded", response.json()
                    pending.discard(job_id)
            time.sleep(0.5)
        assert not pending, f"{len(pending)} job(s) never finished"


def test_soak_mixed_load_kills_and_restarts(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
    peak: dict[int, int] = {}

    def start(name: str):
        workdir = tmp_path / name
        workdir.mkdir()
        env = server_env(workdir, data_dir=str(tmp_path / "data"), **SETTINGS)
        return server_process(command, workdir, env, base, startup_timeout_s=120)

    with start("first") as server:
        first = run_load(base, server.pid, peak, kill_leader=True)
        server.kill()  # the whole server at once, no clean stop (its processes die with it: PDEATHSIG)
        server.wait(timeout=30)
    with start("second") as server:
        second = run_load(base, server.pid, peak, kill_leader=False)
        jobs = first.accepted_jobs + second.accepted_jobs
        assert len(jobs) > 5
        wait_until_all_succeeded(base, jobs)

    statuses = first.statuses + second.statuses
    small = sorted(first.small_latency_ms + second.small_latency_ms)
    print(
        f"soak: statuses {dict(statuses)}, transport errors {first.transport_errors + second.transport_errors}, "
        f"{len(jobs)} jobs, small sketch median {small[len(small) // 2]:.0f} ms, "
        f"{first.huge_served + second.huge_served} huge drawings, peak RSS {max(peak.values()) / 2**20:.0f} MiB"
    )
    assert not [status for status in statuses if status >= 500], statuses
    assert statuses[200] > 20 and statuses[408] > 0, statuses  # small sketches served, stalled uploads cut off
    assert first.huge_served + second.huge_served >= 2
    assert small[len(small) // 2] < 5000, small[-10:]  # the median small photo did not wait on huge ones
    bound = BASELINE_RSS + MAX_CONCURRENT_PIXELS * BYTES_PER_PIXEL
    assert max(peak.values()) < bound, {pid: f"{rss / 2**20:.0f} MiB" for pid, rss in peak.items()}
