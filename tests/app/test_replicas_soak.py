"""A soak of replicas: three `pencil-gpu serve` processes on one machine (CPU backend, one
OS process each) sharing a PostgreSQL job store and one data directory, 60 jobs of every
kind (svd, search, stencil, cs256: 240, a few of them slow stencil shots), one replica
killed with SIGKILL while it runs jobs, started again, and a replica killed again later,
while a thread keeps posting small photos to /sketch on the replicas that are alive.

Asserted:
- every job ends succeeded, with the right result: computed again in this process (SVD:
  NumPy's singular values and U S V^T = A; search: every overlapping occurrence found with
  a regular expression; stencil and CS256: the same CPU reference run on the job built
  from the request, compared file by file and on the summary without its timings);
- exactly once: across every replica's JSON log, each job has one "succeeded" line and no
  "failed" one (none only for a job whose end the killed replica stored just before it
  died: the line follows the commit); the jobs running on a killed replica at the kill ran
  again (attempt >= 2) on another replica;
- nothing half-written: no `*.partial` in the data directory, each job's folder has one result
  folder, `result-<attempt>` of its final attempt, every file of it loads (.npy, .npz,
  .png, .safetensors), and the API serves that attempt's files;
- a killed replica's jobs run again on a survivor within 2 x PENCIL_JOB_LEASE_S (plus a
  poll margin) of the kill;
- /sketch answers 200 on every live replica throughout, the survivors included while they
  take the killed replica's jobs over (only a request in flight to the replica being
  killed may see its connection drop);
- no replica logs an ERROR or a traceback.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
from pencil_testkit import free_port, photo_bytes, server_env
from PIL import Image

from gpu import cs256, stencil
from gpu.cs256 import files as cs256_files
from gpu.cs256.params import Cs256Job, Cs256Params
from gpu.stencil.params import StencilJob
from gpu.svd.params import MatrixSpec
from jobs.runner import runner_lock_path

TOKEN = "replicas-soak-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPLICAS = ("r0", "r1", "r2")
KINDS = ("svd", "search", "stencil", "cs256")
JOBS_PER_KIND = 60
SLOW_PER_WAVE = 4  # slow stencil shots (about 1 s alone, several under load) per wave, so a kill lands mid-run
WAVE_A = 130  # the first kill's wave; the second wave is submitted once the killed replica is back
HEAD = 6  # jobs of a wave submitted before its kill (two slow ones first); the rest go to the survivors after
LEASE_S = 2.0
POLL_MARGIN_S = 1.0  # the polls' own period and latency on two busy cores
FINISH_TIMEOUT_S = 240.0
SETTINGS = {
    "admin_token": TOKEN,
    "processes": "1",
    "workers": "2",
    "max_queue": "16",
    "job_streams": "2",
    "job_lease_s": str(LEASE_S),
    "log_format": "json",
    "log_level": "info",
}
FINISHED = ("succeeded", "failed", "canceled")
RESULT_FOLDER = re.compile(r"result(-[0-9]+)?")
TIMING_KEYS = {
    "stencil": {
        "seconds",
        "wall_seconds",
        "gpts_per_s",
        "effective_gb_per_s",
        "energy",
        "energy_j",
        "average_power_w",
        "gpts_per_j",
    },
    "cs256": {"times_ms", "speedup", "bandwidth_gb_s"},
}


# ---------------------------------------------------------------- the replicas --


class Replica:
    """One `pencil-gpu serve` process (PENCIL_PROCESSES=1: uvicorn in that process) in its
    own session, so a SIGKILL of its process group leaves nothing of it; each start logs
    to a new file <name>-<n>.log."""

    def __init__(self, name: str, root: Path, data_dir: Path, database_url: str):
        self.name = name
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.workdir = root / name
        self.workdir.mkdir()
        self.env = server_env(
            self.workdir, data_dir=str(data_dir), database_url=database_url, replica_id=name, **SETTINGS
        )
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []
        self.generation = 0  # raised by each kill: a request begun before it may see its connection drop
        self.client: httpx.Client | None = None

    def launch(self) -> None:
        log_path = self.workdir / f"{self.name}-{len(self.logs)}.log"
        self.logs.append(log_path)
        command = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port)]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command, cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, f"replica {self.name} exited with {self.proc.returncode}:\n{self.tail()}"
            try:
                body = httpx.get(f"{self.base}/healthz", timeout=5).json()
                if body.get("replica") == self.name and body.get("runs_jobs"):
                    break
            except (httpx.TransportError, ValueError):
                pass
            assert time.monotonic() < deadline, f"replica {self.name} not up within {timeout_s:.0f} s:\n{self.tail()}"
            time.sleep(0.1)
        self.client = httpx.Client(base_url=self.base, headers=AUTH, timeout=60)

    def kill(self) -> None:
        """SIGKILL the replica's process group (the server and anything it started) and reap it."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.generation += 1
        if self.client is not None:
            self.client.close()
            self.client = None

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        except ProcessLookupError:
            pass

    def tail(self, chars: int = 2500) -> str:
        if not self.logs:
            return "(no log)"
        return self.logs[-1].read_text(errors="replace")[-chars:]


class Cluster:
    """The replicas, which of them are alive (the only ones the test and the /sketch load
    talk to), and every HTTP answer the test got from them."""

    def __init__(self, replicas: list[Replica]):
        self.replicas = {replica.name: replica for replica in replicas}
        self.lock = threading.Lock()
        self.alive: list[str] = []
        self.turn = 0
        self.statuses: Counter[tuple[str, int]] = Counter()  # (what, status) of the test's own API calls

    def start(self, names: list[str]) -> None:
        for name in names:
            self.replicas[name].launch()
        for name in names:
            self.replicas[name].wait_ready()
            with self.lock:
                self.alive.append(name)

    def kill(self, name: str) -> float:
        """Take the replica out of the live ones, then SIGKILL it; returns when it was killed."""
        with self.lock:
            self.alive.remove(name)
        killed_at = time.monotonic()
        self.replicas[name].kill()
        return killed_at

    def live(self) -> list[Replica]:
        with self.lock:
            return [self.replicas[name] for name in self.alive]

    def next_live(self) -> Replica:
        with self.lock:
            self.turn += 1
            return self.replicas[self.alive[self.turn % len(self.alive)]]

    def call(self, what: str, method: str, path: str, replica: Replica | None = None, **request) -> httpx.Response:
        replica = replica or self.next_live()
        assert replica.client is not None
        response = replica.client.request(method, path, **request)
        with self.lock:
            self.statuses[(what, response.status_code)] += 1
        assert response.status_code < 500, (
            f"{method} {path} on live replica {replica.name}: {response.status_code} {response.text[:500]}\n"
            f"{self.tails()}"
        )
        return response

    def get_json(self, path: str, what: str = "poll") -> Any:
        response = self.call(what, "GET", path)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:500]}"
        return response.json()

    def stop(self) -> None:
        for replica in self.replicas.values():
            replica.stop()

    def tails(self) -> str:
        parts = [f"--- {name} ({r.logs[-1].name if r.logs else '-'}):\n{r.tail()}" for name, r in self.replicas.items()]
        return "\n".join(parts)


class SketchLoad:
    """A thread posting small photos to /sketch on the live replicas, round robin. A request
    that gets no answer is excused only when its replica was killed while it ran."""

    def __init__(self, cluster: Cluster, photos: list[bytes]):
        self.cluster, self.photos = cluster, photos
        self.stop_event = threading.Event()
        self.served: Counter[str] = Counter()
        self.served_at: list[tuple[float, str]] = []  # (time.monotonic(), replica) of each 200
        self.failures: list[str] = []
        self.dropped_by_kill = 0
        self.thread = threading.Thread(target=self._run, name="sketch-load", daemon=True)

    def __enter__(self) -> SketchLoad:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(timeout=120)

    def _run(self) -> None:
        clients: dict[tuple[str, int], httpx.Client] = {}
        i = 0
        try:
            while not self.stop_event.is_set():
                with self.cluster.lock:
                    alive = list(self.cluster.alive)
                    replica = self.cluster.replicas[alive[i % len(alive)]] if alive else None
                    generation = replica.generation if replica else 0
                if replica is None:
                    self.stop_event.wait(0.1)
                    continue
                key = (replica.name, generation)
                if key not in clients:
                    clients[key] = httpx.Client(base_url=replica.base, timeout=60)
                photo = self.photos[i % len(self.photos)]
                i += 1
                try:
                    response = clients[key].post("/sketch", files={"image": ("p.jpg", photo, "image/jpeg")})
                except httpx.TransportError as exc:
                    with self.cluster.lock:
                        killed = replica.generation != generation or replica.name not in self.cluster.alive
                    if killed:
                        self.dropped_by_kill += 1
                    else:
                        self.failures.append(f"{replica.name}: {type(exc).__name__}: {exc}")
                    continue
                if response.status_code == 200 and response.content:
                    self.served[replica.name] += 1
                    self.served_at.append((time.monotonic(), replica.name))
                else:
                    self.failures.append(f"{replica.name}: {response.status_code} {response.text[:300]}")
                self.stop_event.wait(0.1)
        finally:
            for client in clients.values():
                client.close()


# ------------------------------------------------------------------- the jobs --


@dataclass
class Planned:
    """A job to submit (`request`: httpx keyword arguments) and how to check its result:
    `check(summary, folder)` raises AssertionError when it is not the expected one."""

    kind: str
    request: dict[str, Any]
    check: Callable[[dict[str, Any], Path], None]
    slow: bool = False
    job_id: str = ""
    submitted_to: str = ""
    notes: dict[str, Any] = field(default_factory=dict)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def load_npy(path: Path) -> np.ndarray:
    return np.load(path, allow_pickle=False)


def jsonable(value: Any) -> Any:
    """`value` as the API gives it back: JSON types, NaN and infinities as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, np.generic):
        return jsonable(value.item())
    return value


def same_files(expected: dict[str, Any], folder: Path) -> None:
    """The result files the CPU reference writes for the job, against those in `folder`:
    the same names; arrays equal bit for bit; images equal pixel for pixel."""
    names = sorted(path.name for path in folder.iterdir())
    assert names == sorted(expected), f"files {names}, expected {sorted(expected)}"
    for name, write in expected.items():
        buffer = io.BytesIO()
        write(buffer)
        data = buffer.getvalue()
        path = folder / name
        if name.endswith(".npy"):
            want, got = np.load(io.BytesIO(data), allow_pickle=False), load_npy(path)
            assert want.dtype == got.dtype and want.shape == got.shape, (name, want.dtype, got.dtype, got.shape)
            assert np.array_equal(want, got, equal_nan=want.dtype.kind == "f"), f"{name} differs"
        elif name.endswith(".png"):
            want_image, got_image = Image.open(io.BytesIO(data)), Image.open(path)
            assert want_image.size == got_image.size and want_image.mode == got_image.mode, name
            assert np.array_equal(np.asarray(want_image), np.asarray(got_image)), f"{name} differs"
        elif name.endswith(".safetensors"):
            assert path.read_bytes() == data, f"{name} differs"
            cs256_files.load_safetensors(path)  # the format's own reader (NumPy has no bfloat16)
        elif name.endswith(".npz"):
            with np.load(io.BytesIO(data), allow_pickle=False) as want, np.load(path, allow_pickle=False) as got:
                assert sorted(want.files) == sorted(got.files), name
                for key in want.files:
                    assert np.array_equal(want[key], got[key]), f"{name}[{key}] differs"
        else:
            assert path.read_bytes() == data, f"{name} differs"


def same_summary(kind: str, expected: dict[str, Any], actual: dict[str, Any]) -> None:
    skip = TIMING_KEYS.get(kind, set())
    want = {key: value for key, value in jsonable(expected).items() if key not in skip}
    got = {key: value for key, value in actual.items() if key not in skip}
    assert got == want, f"summary differs:\n got {got}\nwant {want}"


def svd_job(rng: np.random.Generator, upload: bool) -> Planned:
    m, n = int(rng.integers(4, 48)), int(rng.integers(3, 48))
    dtype = str(rng.choice(["float32", "float64"]))
    options = {
        "method": str(rng.choice(["lapack", "auto", "golub_reinsch"])),
        "compute_uv": bool(rng.random() < 0.8),
        "full_matrices": bool(rng.random() < 0.25),
    }
    if upload:
        matrix = (rng.standard_normal((m, n)) * rng.uniform(0.1, 100.0)).astype(dtype)
        request = {
            "files": {"matrix": ("a.npy", npy(matrix), "application/octet-stream")},
            "data": {"params": json.dumps(options)},
        }
    else:
        spec = {
            "m": m,
            "n": n,
            "dtype": dtype,
            "seed": int(rng.integers(0, 2**31)),
            "kind": str(rng.choice(["gaussian", "ill_conditioned", "low_rank"])),
            "cond": float(10 ** rng.uniform(0.5, 4)),
        }
        matrix = MatrixSpec(**spec).build()
        request = {"json": {"spec": spec, **options}}

    def check(summary: dict[str, Any], folder: Path) -> None:
        a = matrix.astype(np.float64)
        k = min(m, n)
        want = np.linalg.svd(a, compute_uv=False)
        eps = np.finfo(matrix.dtype).eps
        tolerance = 50 * eps * max(m, n) * max(want[0], 1e-30)
        s = load_npy(folder / "s.npy")
        assert s.shape == (k,) and s.dtype == matrix.dtype, (s.shape, s.dtype)
        np.testing.assert_allclose(s, want, rtol=0, atol=tolerance)
        assert summary["singular_values"] == s[:1024].astype(float).tolist()
        assert summary["singular_values_count"] == k and (summary["m"], summary["n"]) == (m, n)
        assert summary["method"] == ("lapack" if options["method"] == "auto" else options["method"])
        names = {path.name for path in folder.iterdir()}
        if not options["compute_uv"]:
            assert names == {"s.npy"} and summary["accuracy"] is None, names
            return
        assert names == {"s.npy", "u.npy", "vt.npy"}, names
        u, vt = load_npy(folder / "u.npy"), load_npy(folder / "vt.npy")
        full = options["full_matrices"]
        assert u.shape == ((m, m) if full else (m, k)) and vt.shape == ((n, n) if full else (k, n)), (u.shape, vt.shape)
        rebuilt = (u[:, :k].astype(np.float64) * s) @ vt[:k].astype(np.float64)
        np.testing.assert_allclose(rebuilt, a, rtol=0, atol=tolerance * 4)
        assert summary["accuracy"] is not None and summary["accuracy"]["resid"] < 100, summary["accuracy"]

    return Planned("svd", request, check, notes={"shape": (m, n), **options})


def search_text(rng: np.random.Generator, size: int, alphabet: bytes) -> bytes:
    weights = rng.random(len(alphabet)) + 0.2
    return bytes(rng.choice(np.frombuffer(alphabet, np.uint8), size=size, p=weights / weights.sum()).tolist())


def search_patterns(rng: np.random.Generator, text: bytes, alphabet: bytes) -> list[bytes]:
    patterns = []
    for _ in range(int(rng.integers(1, 5))):
        length = int(rng.integers(1, 7))
        if rng.random() < 0.7:
            start = int(rng.integers(0, len(text) - length))
            patterns.append(text[start : start + length])
        else:
            patterns.append(bytes(rng.choice(np.frombuffer(alphabet, np.uint8), size=length).tolist()))
    return patterns


def search_job(rng: np.random.Generator, corpora: list[tuple[str, bytes]]) -> Planned:
    which = rng.random()
    body: dict[str, Any]
    if which < 0.25 and corpora:
        corpus_id, text = corpora[int(rng.integers(0, len(corpora)))]
        body = {"corpus_id": corpus_id}
        patterns = search_patterns(rng, text, b"abc \n")
        wire: list[Any] = [p.decode() for p in patterns]
    elif which < 0.55:
        alphabet = b"ab\n\x00\xff\xfe"
        text = search_text(rng, int(rng.integers(200, 8000)), alphabet)
        body = {"text_base64": base64.b64encode(text).decode()}
        patterns = search_patterns(rng, text, alphabet)
        wire = [{"base64": base64.b64encode(p).decode()} for p in patterns]
    else:
        text = search_text(rng, int(rng.integers(200, 20000)), b"abc \n")
        body = {"text": text.decode()}
        patterns = search_patterns(rng, text, b"abc \n")
        wire = [p.decode() for p in patterns]
    fused = bool(rng.random() < 0.2)
    algorithm = str(rng.choice(["auto", "rabin_karp"] if fused else ["auto", "rabin_karp", "kmp", "boyer_moore"]))
    options = {
        "algorithm": algorithm,
        "fused": fused,
        "max_positions": int(rng.choice([0, 3, 50, 1000])),
        "line_numbers": bool(rng.random() < 0.5),
        "positions": str(rng.choice(["json", "files"], p=[0.3, 0.7])),  # files: every position on disk
    }
    request = {"json": {**body, "patterns": wire, **options}}

    def check(summary: dict[str, Any], folder: Path) -> None:
        newlines = np.flatnonzero(np.frombuffer(text, np.uint8) == ord("\n"))
        assert summary["text_bytes"] == len(text) and len(summary["patterns"]) == len(patterns)
        expected_files = set()
        for i, (pattern, found) in enumerate(zip(patterns, summary["patterns"], strict=True)):
            want = np.array([m.start() for m in re.finditer(b"(?=" + re.escape(pattern) + b")", text)], np.int64)
            if options["positions"] == "files":
                got = load_npy(folder / f"positions_{i}.npy")
                assert np.array_equal(got, want), f"pattern {pattern!r}: {got[:10]} vs {want[:10]}"
                expected_files.add(f"positions_{i}.npy")
            assert found["count"] == want.size and found["length"] == len(pattern)
            assert base64.b64decode(found["pattern_base64"]) == pattern
            assert found["positions"] == want[: options["max_positions"]].tolist()
            assert found["positions_truncated"] == (want.size > options["max_positions"])
            if options["line_numbers"]:
                lines = np.searchsorted(newlines, want, side="left") + 1
                assert found["lines"] == lines[: options["max_positions"]].tolist()
                if options["positions"] == "files":
                    assert np.array_equal(load_npy(folder / f"lines_{i}.npy"), lines), f"lines of {pattern!r}"
                    expected_files.add(f"lines_{i}.npy")
        assert {path.name for path in folder.iterdir()} == expected_files

    return Planned("search", request, check, notes={"bytes": len(text), "patterns": len(patterns), **options})


def stencil_job(rng: np.random.Generator, slow: bool, upload: bool, snapshots: bool = False) -> Planned:
    """A small shot, or a slow one (about 1 s alone on a core); with `snapshots`, a slow one
    with the most snapshots (204 result files: writing them takes a while)."""
    if slow:
        nx, ny, nz, steps = 96, 64, 64, int(rng.integers(1200, 2000))
        snapshot_every = -(-steps // 100) if snapshots else 0  # at most 100 snapshots
    else:
        nx, ny, nz = int(rng.integers(16, 30)), int(rng.integers(12, 22)), int(rng.integers(12, 22))
        steps = int(rng.integers(20, 90))
        snapshot_every = int(rng.choice([0, max(1, steps // 2), steps]))
    body: dict[str, Any] = {
        "nx": nx,
        "ny": ny,
        "nz": nz,
        "h": 10.0,
        "steps": steps,
        "f0": float(np.round(rng.uniform(8.0, 14.0), 2)),
        "snapshot_every": snapshot_every,
        "sponge": 0 if slow else int(rng.choice([0, 3])),
    }
    if rng.random() < 0.6:
        body["source"] = [int(rng.integers(2, n - 2)) for n in (nx, ny, nz)]
    if not slow and rng.random() < 0.5:
        z = int(rng.integers(2, nz - 2))
        body["receivers"] = {"start": [2, ny // 2, z], "end": [nx - 3, ny // 2, z], "count": int(rng.integers(1, nx))}
    model = None
    if upload:
        planes = rng.uniform(1500.0, 3000.0, size=(nz, 1, 1))
        model = np.ascontiguousarray(np.broadcast_to(planes, (nz, ny, nx)), dtype=np.float32)
        params = {key: value for key, value in body.items() if key not in ("nx", "ny", "nz")}
        request = {
            "files": {"model": ("v.npy", npy(model), "application/octet-stream")},
            "data": {"params": json.dumps(params)},
        }
    else:
        if rng.random() < 0.5:
            body["model"] = {"type": "constant", "velocity": float(np.round(rng.uniform(1500.0, 3000.0)))}
        else:
            top = float(np.round(rng.uniform(0.2, 0.8) * nz * 10.0))
            velocities = sorted(float(np.round(v)) for v in rng.uniform(1500.0, 3200.0, 2))
            body["model"] = {"type": "layered", "depths": [0.0, top], "velocities": velocities}
        request = {"json": body}

    def check(summary: dict[str, Any], folder: Path) -> None:
        job = StencilJob.from_request(body, model)
        expected = stencil.run(job)
        same_summary("stencil", expected.summary, summary)
        same_files(expected.files, folder)

    return Planned("stencil", request, check, slow=slow, notes={"grid": (nx, ny, nz), "steps": steps})


def cs256_job(rng: np.random.Generator) -> Planned:
    m, n = int(rng.integers(2, 40)), int(rng.integers(16, 700))
    dtype = str(rng.choice(["float16", "bfloat16", "float32"]))
    vectors = int(rng.integers(1, 4))
    options: dict[str, Any] = {
        "sparsity": None if rng.random() < 0.15 else float(np.round(rng.uniform(0.2, 0.9), 3)),
        "vec": int(rng.choice([4, 8, 16])),
        "repeats": int(rng.integers(1, 3)),
        "save": str(rng.choice(["npz", "safetensors", "both", "none"])),
    }
    spec = {"m": m, "n": n, "dtype": dtype, "seed": int(rng.integers(0, 2**31))}
    x = None
    if rng.random() < 0.3:
        x = rng.standard_normal((n, vectors)) if vectors > 1 else rng.standard_normal(n)
        body = {"spec": spec, "x": x.tolist(), **options}
    else:
        body = {"spec": spec, "vectors": vectors, **options}
        if vectors == 1 and rng.random() < 0.3:
            body["variant"] = "split4"
    request = {"json": body}

    def check(summary: dict[str, Any], folder: Path) -> None:
        params = Cs256Params(
            sparsity=options["sparsity"],
            vec=options["vec"],
            vectors=vectors,
            repeats=options["repeats"],
            save=options["save"],
            variant=body.get("variant", "group"),
        )
        expected = cs256.run(Cs256Job.generated(params, m, n, dtype, spec["seed"], x))
        same_summary("cs256", expected.summary, summary)
        same_files(expected.files, folder)

    return Planned("cs256", request, check, notes={"shape": (m, n), "dtype": dtype, **options})


def plan_jobs(rng: np.random.Generator, corpora: list[tuple[str, bytes]]) -> list[Planned]:
    """60 jobs of each kind in a random order, in two waves (WAVE_A jobs, then the rest),
    each wave with SLOW_PER_WAVE slow stencil shots: two first (in the second wave, with many
    result files), the others spread through it."""
    slow = 2 * SLOW_PER_WAVE
    jobs = [svd_job(rng, upload=i % 2 == 1) for i in range(JOBS_PER_KIND)]
    jobs += [search_job(rng, corpora) for _ in range(JOBS_PER_KIND)]
    jobs += [stencil_job(rng, slow=False, upload=i % 6 == 5) for i in range(JOBS_PER_KIND - slow)]
    jobs += [cs256_job(rng) for _ in range(JOBS_PER_KIND)]
    order = [jobs[i] for i in rng.permutation(len(jobs))]
    slow_jobs = [stencil_job(rng, slow=True, upload=False, snapshots=i in (4, 5)) for i in range(slow)]
    wave_a, wave_b = order[: WAVE_A - SLOW_PER_WAVE], order[WAVE_A - SLOW_PER_WAVE :]
    for wave, extra in ((wave_a, slow_jobs[:SLOW_PER_WAVE]), (wave_b, slow_jobs[SLOW_PER_WAVE:])):
        step = len(wave) // (SLOW_PER_WAVE - 1)
        wave[:0] = extra[:2]  # two at the head: the replica the head goes to runs both when it is killed
        for k, job in enumerate(extra[2:], start=1):
            wave.insert(2 + k * step, job)
    planned = wave_a + wave_b
    assert Counter(job.kind for job in planned) == {kind: JOBS_PER_KIND for kind in KINDS}
    return planned


# ------------------------------------------------------------------- the kills --


@dataclass
class Kill:
    victim: str
    at: float  # time.monotonic() of the SIGKILL
    caught: dict[str, int]  # id -> attempt of the jobs that were running on the victim when it died
    ended: dict[str, int]  # id -> attempt of its jobs that ended just before the kill (their end line may be lost)
    left: dict[str, list[str]]  # id -> the files in the result folder its dead run left
    requeued_s: dict[str, float] = field(default_factory=dict)  # seen back in the queue (or running elsewhere)
    rerun_s: dict[str, float] = field(default_factory=dict)  # seen running (or finished) with a higher attempt
    rerun_on: dict[str, str] = field(default_factory=dict)
    rerun_attempt: dict[str, int] = field(default_factory=dict)


def submit(cluster: Cluster, jobs: list[Planned], to: Replica | None = None) -> None:
    """POST the jobs to `to`, or round robin to the live replicas; each must be accepted (202)."""
    for job in jobs:
        replica = to or cluster.next_live()
        response = cluster.call("submit", "POST", f"/jobs/{job.kind}", replica=replica, **job.request)
        assert response.status_code == 202, f"{job.kind} {job.notes}: {response.status_code} {response.text[:500]}"
        job.job_id, job.submitted_to = response.json()["id"], replica.name


class Submitter(threading.Thread):
    """submit() on a thread (the rest of a wave, to the survivors, while the reruns are watched)."""

    def __init__(self, cluster: Cluster, jobs: list[Planned]):
        super().__init__(name="submitter", daemon=True)
        self.cluster, self.jobs = cluster, jobs
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            submit(self.cluster, self.jobs)
        except BaseException as exc:  # re-raised by finish()
            self.error = exc

    def finish(self) -> None:
        self.join(timeout=300)
        assert not self.is_alive(), "the submissions did not end within 300 s"
        if self.error is not None:
            raise self.error


def run_wave(
    cluster: Cluster, wave: list[Planned], slow_ids: set[str], head_to: Replica, writing: Path | None = None
) -> Kill:
    """Submit the head of the wave to `head_to` (its runner, woken by them, takes the first
    two), SIGKILL a replica running its jobs (with `writing`, the data directory: while one
    writes its result files), then submit the rest round robin to the survivors while the
    killed replica's jobs are watched until they run again."""
    submit(cluster, wave[:HEAD], to=head_to)
    slow_ids |= {job.job_id for job in wave[:HEAD] if job.slow}
    if writing is None:
        kill = kill_busy_replica(cluster, slow_ids)
    else:
        kill = kill_while_writing(cluster, writing, [job.job_id for job in wave[:HEAD] if job.slow])
    rest = Submitter(cluster, wave[HEAD:])
    rest.start()
    watch_reruns(cluster, kill)
    rest.finish()
    slow_ids |= {job.job_id for job in wave if job.slow}
    return kill


def running_jobs(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.get_json("/jobs?status=running&page_size=500")["jobs"]


def kill_busy_replica(cluster: Cluster, slow_ids: set[str], wait_two_s: float = 3.0, wait_slow_s: float = 20.0) -> Kill:
    """Wait until a live replica runs a slow job not far along and another job beside it (or,
    after `wait_two_s`, a slow job; after `wait_slow_s`, any job), SIGKILL it and return which
    jobs it was running at that moment."""
    began = time.monotonic()
    deadline = began + wait_slow_s
    while True:
        running = running_jobs(cluster)
        live = {replica.name for replica in cluster.live()}
        slow = [j for j in running if j["id"] in slow_ids and j["replica"] in live and j["progress"] < 0.5]
        busy = Counter(j["replica"] for j in running if j["replica"] in live)
        if slow:
            victim = max({j["replica"] for j in slow}, key=lambda name: busy[name])
            if busy[victim] >= 2 or time.monotonic() > began + wait_two_s:
                break
        if busy and time.monotonic() > deadline:
            victim = busy.most_common(1)[0][0]
            break
        assert time.monotonic() < deadline + 60, f"no replica ran a job for 80 s:\n{cluster.tails()}"
        time.sleep(0.05)
    return kill_replica(cluster, victim, running, None)


def kill_while_writing(cluster: Cluster, data_dir: Path, ids: list[str], timeout_s: float = 60.0) -> Kill:
    """Watch the job folders of `ids` (every 10 ms) until the runner of one of them has begun
    writing its result folder, and SIGKILL its replica then."""
    deadline = time.monotonic() + timeout_s
    while True:
        for job_id in ids:
            try:
                folders = [p for p in (data_dir / "jobs" / job_id).iterdir() if RESULT_FOLDER.fullmatch(p.name)]
                writing = [folder for folder in folders if any(folder.iterdir())]
            except FileNotFoundError:  # not stored yet, or the folder was (re)made as we looked
                continue
            if not writing:
                continue
            job = cluster.get_json(f"/jobs/{job_id}")
            if job["status"] == "running" and writing[0].name == f"result-{job['attempt']}":
                return kill_replica(cluster, job["replica"], [job], data_dir)
        assert time.monotonic() < deadline, f"no job of {ids} was seen writing its results:\n{cluster.tails()}"
        time.sleep(0.01)


def kill_replica(cluster: Cluster, victim: str, running: list[dict[str, Any]], data_dir: Path | None) -> Kill:
    """SIGKILL `victim` and find which jobs it was running then: those of `running` (listed
    just before) and those listed running on it just after, less any whose end it had stored.
    With `data_dir`, record the files their dead runs left in their result folders."""
    before = {j["id"]: j["attempt"] for j in running if j["replica"] == victim}
    killed_at = cluster.kill(victim)
    after = {j["id"]: j["attempt"] for j in running_jobs(cluster) if j["replica"] == victim}
    time.sleep(0.3)  # a commit sent just before the kill has landed by now
    caught, ended, left = {}, {}, {}
    for job_id, attempt in {**before, **after}.items():
        now = cluster.get_json(f"/jobs/{job_id}")
        if now["status"] in FINISHED and now["attempt"] == attempt:
            ended[job_id] = attempt  # its end was stored before the kill
            continue
        caught[job_id] = attempt
        folder = data_dir / "jobs" / job_id / f"result-{attempt}" if data_dir is not None else None
        if folder is not None and folder.is_dir():
            left[job_id] = sorted(path.name for path in folder.iterdir())
    return Kill(victim, killed_at, caught, ended, left)


def watch_reruns(cluster: Cluster, kill: Kill, timeout_s: float = 60.0) -> None:
    """Poll the caught jobs every 0.1 s until each runs again (a higher attempt, running or
    finished), recording when."""
    pending = set(kill.caught)
    while pending:
        for job_id in sorted(pending):
            job = cluster.get_json(f"/jobs/{job_id}", "watch")
            elapsed = time.monotonic() - kill.at
            if job_id not in kill.requeued_s and (job["status"] != "running" or job["replica"] != kill.victim):
                kill.requeued_s[job_id] = elapsed
            if job["attempt"] > kill.caught[job_id] and job["status"] in ("running", *FINISHED):
                kill.rerun_s[job_id], kill.rerun_on[job_id] = elapsed, job["replica"]
                kill.rerun_attempt[job_id] = job["attempt"]
                pending.discard(job_id)
        assert time.monotonic() - kill.at < timeout_s, (
            f"jobs of killed replica {kill.victim} not running again after {timeout_s:.0f} s: {sorted(pending)}\n"
            f"{cluster.tails()}"
        )
        time.sleep(0.1)


def wait_all_finished(cluster: Cluster, jobs: list[Planned], timeout_s: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        listed = {j["id"]: j for j in cluster.get_json("/jobs?page_size=500")["jobs"]}
        missing = [job.job_id for job in jobs if job.job_id not in listed]
        assert not missing, f"jobs missing from GET /jobs: {missing[:5]}"
        if all(listed[job.job_id]["status"] in FINISHED for job in jobs):
            return listed
        if time.monotonic() > deadline:
            statuses = Counter(listed[job.job_id]["status"] for job in jobs)
            stuck = [listed[job.job_id] for job in jobs if listed[job.job_id]["status"] not in FINISHED][:5]
            raise AssertionError(f"not finished after {timeout_s:.0f} s: {dict(statuses)}; {stuck}\n{cluster.tails()}")
        time.sleep(0.5)


# ------------------------------------------------------------------- the logs --


def job_log_lines(replicas: list[Replica]) -> list[dict[str, Any]]:
    """The pencil.jobs records of every log file of every replica, each with `file`."""
    records = []
    for replica in replicas:
        for path in replica.logs:
            for line in path.read_text(errors="replace").splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut by the SIGKILL, or a library's own output
                if isinstance(record, dict) and record.get("logger") == "pencil.jobs":
                    records.append({**record, "file": path.name})
    return records


def problem_lines(replicas: list[Replica]) -> list[str]:
    """ERROR and CRITICAL lines of every log, and any traceback."""
    found = []
    for replica in replicas:
        for path in replica.logs:
            for line in path.read_text(errors="replace").splitlines():
                if '"level": "ERROR"' in line or '"level": "CRITICAL"' in line or "Traceback" in line:
                    found.append(f"{path.name}: {line[:400]}")
    return found


# ------------------------------------------------------------------- the test --


def test_three_replicas_on_postgres_survive_two_sigkills(tmp_path, postgres_url, rng):
    started = time.monotonic()
    data_dir = tmp_path / "data"
    cluster = Cluster([Replica(name, tmp_path, data_dir, postgres_url) for name in REPLICAS])
    photos = [photo_bytes(name, "jpeg", 96, rng=rng) for name in ("astronaut", "coffee", "chelsea", "camera")]
    kills: list[Kill] = []
    try:
        cluster.start(list(REPLICAS))
        startup_s = time.monotonic() - started
        corpora = []
        for i in range(2):
            text = search_text(rng, int(rng.integers(20_000, 60_000)), b"abc \n")
            response = cluster.call("corpus", "POST", f"/corpora?name=soak-{i}", content=text)
            assert response.status_code == 201, response.text
            corpora.append((response.json()["id"], text))
        jobs = plan_jobs(rng, corpora)
        slow_ids: set[str] = set()
        with SketchLoad(cluster, photos) as sketches:
            kills.append(run_wave(cluster, jobs[:WAVE_A], slow_ids, cluster.live()[0]))
            restart_began = time.monotonic()
            cluster.start([kills[0].victim])  # the same settings, while the survivors work through the wave
            restart_s = time.monotonic() - restart_began
            others = [replica for replica in cluster.live() if replica.name != kills[0].victim]
            kills.append(run_wave(cluster, jobs[WAVE_A:], slow_ids, others[0], writing=data_dir))
            final = wait_all_finished(cluster, jobs, FINISH_TIMEOUT_S)
            finished_s = time.monotonic() - started
        replicas = list(cluster.replicas.values())

        # every job succeeded
        failed = [final[job.job_id] for job in jobs if final[job.job_id]["status"] != "succeeded"]
        assert not failed, f"{len(failed)} job(s) did not succeed: {failed[:5]}\n{cluster.tails()}"

        # exactly once: one "succeeded" line per job across every replica's logs, no "failed" one; a
        # job whose end a replica stored just before its SIGKILL may lack its line (it is logged after)
        records = job_log_lines(replicas)
        ends = Counter((r["job_id"], r["status"]) for r in records if "status" in r and "job_id" in r)
        unlogged = {
            job_id
            for kill in kills
            for job_id, attempt in kill.ended.items()
            if final[job_id]["replica"] == kill.victim and final[job_id]["attempt"] == attempt
        }
        for job in jobs:
            lines = ends[(job.job_id, "succeeded")]
            assert lines == 1 or (lines == 0 and job.job_id in unlogged), (
                f"job {job.job_id} ({job.kind}) logged succeeded {ends[(job.job_id, 'succeeded')]} times: "
                f"{[r for r in records if r.get('job_id') == job.job_id]}"
            )
            assert ends[(job.job_id, "failed")] == 0, [r for r in records if r.get("job_id") == job.job_id]
        lost_lines = [r for r in records if r.get("status") == "lost"]

        # the second kill cut a run off while it wrote its result files (all gone now: see below)
        assert any(kills[1].left.values()), kills[1].left

        # the jobs a kill caught ran again elsewhere, within two leases
        bound = 2 * LEASE_S + POLL_MARGIN_S
        for kill in kills:
            assert kill.caught, f"the kill of {kill.victim} caught no running job"
            for job_id, attempt in kill.caught.items():
                body = final[job_id]
                assert body["attempt"] > attempt >= 1, (job_id, attempt, body)
                assert kill.rerun_on[job_id] != kill.victim, (job_id, kill.rerun_on[job_id])
                assert body["replica"] != kill.victim or body["attempt"] > kill.rerun_attempt[job_id], body
            late = {job_id: round(s, 2) for job_id, s in kill.rerun_s.items() if s > bound}
            assert not late, f"jobs of {kill.victim} ran again later than {bound} s after the kill: {late}"

        # nothing half-written; one result folder per job, its final attempt's
        partial = [str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.name.endswith(".partial")]
        assert not partial, partial
        by_id = {job.job_id: job for job in jobs}
        for job in jobs:
            folder = data_dir / "jobs" / job.job_id
            results = sorted(p.name for p in folder.iterdir() if RESULT_FOLDER.fullmatch(p.name))
            assert results == [f"result-{final[job.job_id]['attempt']}"], (job.job_id, results, final[job.job_id])
            json.loads((folder / "job.json").read_bytes())
            for path in (folder / results[0]).iterdir():
                assert not path.name.startswith(".") and path.is_file(), path
                if path.suffix == ".npy":
                    load_npy(path)
                elif path.suffix == ".npz":
                    with np.load(path, allow_pickle=False) as archive:
                        assert all(archive[key] is not None for key in archive.files)
                elif path.suffix == ".png":
                    with Image.open(path) as image:
                        image.load()
                elif path.suffix == ".safetensors":
                    cs256_files.load_safetensors(path)
                else:
                    raise AssertionError(f"unexpected result file {path}")
        assert not [p.name for p in (data_dir / "jobs").iterdir() if p.name not in by_id], "stray job folders"

        # the right results (the summaries through the API; the API serves the final attempt's files)
        caught = {job_id for kill in kills for job_id in kill.caught}
        for job in jobs:
            body = cluster.get_json(f"/jobs/{job.job_id}/result", "result")
            folder = data_dir / "jobs" / job.job_id / f"result-{final[job.job_id]['attempt']}"
            assert set(body["files"]) == {p.name for p in folder.iterdir()}, (job.job_id, body["files"])
            if job.job_id in caught:
                for name, url in body["files"].items():
                    response = cluster.call("file", "GET", url)
                    assert response.status_code == 200 and response.content == (folder / name).read_bytes(), name
            try:
                job.check(body["result"], folder)
            except AssertionError as exc:
                raise AssertionError(f"job {job.job_id} ({job.kind} {job.notes}) has a wrong result: {exc}") from exc
        checked_s = time.monotonic() - started

        # /sketch kept answering on the survivors
        assert not sketches.failures, f"/sketch on live replicas: {sketches.failures[:10]}\n{cluster.tails()}"
        assert sum(sketches.served.values()) >= 30 and all(sketches.served[name] for name in REPLICAS), sketches.served
        for kill in kills:  # and while the killed replica's jobs were being taken over
            window = (kill.at, kill.at + max(kill.rerun_s.values()))
            during = Counter(name for t, name in sketches.served_at if window[0] <= t <= window[1])
            assert sum(during.values()) >= 3 and kill.victim not in during, (kill.victim, during)
        assert not [key for key in cluster.statuses if key[1] >= 500], cluster.statuses

        problems = problem_lines(replicas)
        assert not problems, "\n".join(problems[:20])

        reruns = [f"{kill.victim}: " + ", ".join(f"{s:.2f}" for s in sorted(kill.rerun_s.values())) for kill in kills]
        print(
            f"replicas soak: {len(jobs)} jobs ({len(slow_ids)} slow), start {startup_s:.1f} s, restart "
            f"{restart_s:.1f} s, all finished at {finished_s:.1f} s, checked at {checked_s:.1f} s; kills caught "
            f"{[len(kill.caught) for kill in kills]} running job(s), run again after (s) {reruns} "
            f"(back in the queue after {[sorted(round(s, 2) for s in kill.requeued_s.values()) for kill in kills]}); "
            f"attempts {dict(Counter(final[job.job_id]['attempt'] for job in jobs))}; lost-lease lines "
            f"{len(lost_lines)}; ended at a kill {[len(kill.ended) for kill in kills]}, unlogged {len(unlogged)}; "
            f"files left by the run cut off while writing {[len(names) for names in kills[1].left.values()]} "
            f"(partial: {sum(name.endswith('.partial') for names in kills[1].left.values() for name in names)}); "
            f"victims {[kill.victim for kill in kills]}, caught kinds "
            f"{[[(by_id[i].kind, by_id[i].slow) for i in kill.caught] for kill in kills]}; "
            f"/sketch 200s {dict(sketches.served)}, dropped by a kill {sketches.dropped_by_kill}; "
            f"API {dict(Counter(status for _, status in cluster.statuses.elements()))}"
        )
    finally:
        cluster.stop()
        for name in REPLICAS:  # the replicas' runner locks, on local disk (jobs/runner.py)
            runner_lock_path(SimpleNamespace(shared=True, replica=name, data_dir=data_dir)).unlink(missing_ok=True)
