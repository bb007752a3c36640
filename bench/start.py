"""From a start to full speed: the shipped server (`python -m app.cli serve`, the image's
command, with jobs on) timed from its spawn to GET /readyz 200 and to each process serving,
then its first /sketch and first job of each kind against the same request sent again.

    python bench/start.py [--starts fresh,restart] [--processes 0] [--out DIR] [--env K=V ...]

- fresh: empty kernel caches (CUPY_CACHE_DIR, CUDA_CACHE_PATH) and an empty data directory,
  as on a machine that never ran the server (with --drop-page-cache, root only, the OS page
  cache is dropped too, so imports read the disk);
- restart: the same server stopped and started again, caches and data kept.

For each start: ready_s (spawn to the first /readyz 200: one process serves), all_ready_s
(every process has answered /healthz), the first /sketch of a 1080p JPEG and the median of 5
after it, and each job kind's first run against a second identical one (submit to finished,
wall time). Targets (issue 35): ready <= 10 s fresh and <= 5 s on a restart; every first
<= 2x its warm run. Prints a table; --out writes start.json and the server logs.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e import free_port, spawn_server, stop_server, wait_until_served  # bench/ is not a package

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-start"
# The first job of each kind and its warm twin: (kind, JSON body). Sizes of issue 35's figures.
JOBS = {
    "svd 4096x4096": ("svd", {"spec": {"m": 4096, "n": 4096, "kind": "ill_conditioned", "cond": 1e6, "seed": 1}}),
    "svd 8192x512": ("svd", {"spec": {"m": 8192, "n": 512, "kind": "gaussian", "seed": 2}}),
    "stencil 256^3": (
        "stencil",
        {"nx": 256, "ny": 256, "nz": 256, "h": 10.0, "steps": 200, "f0": 12.0, "source": [128, 128, 16],
         "receivers": {"start": [8, 128, 8], "end": [247, 128, 8], "count": 64},
         "model": {"type": "constant", "velocity": 2000.0}, "snapshot_every": 0},
    ),
    "cs256 4096x4096": ("cs256", {"spec": {"m": 4096, "n": 4096, "dtype": "float16", "seed": 1}, "sparsity": 0.5}),
}  # fmt: skip
CORPUS_MB = 256  # the search's stored corpus (a first search streams it to the device)


def photo_jpeg() -> bytes:
    """scikit-image's astronaut at 1920x1080, as a JPEG (quality 90)."""
    import skimage.data

    image = Image.fromarray(skimage.data.astronaut()).resize((1920, 1080), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def corpus_text(megabytes: int, seed: int) -> bytes:
    """`megabytes` of English-like words (seeded), a fresh text for each start."""
    words = np.array(b"the of and to in that it was he for on are as with his they at be this from".split())
    rng = np.random.default_rng(seed)
    chunk = b" ".join(words[rng.integers(0, len(words), 200_000)]) + b"\n"
    return (chunk * (megabytes * 2**20 // len(chunk) + 1))[: megabytes * 2**20]


def request(port: int, method: str, path: str, body: bytes | None = None, headers=None, timeout=600.0):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body, {"Authorization": f"Bearer {TOKEN}", **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def sketch_ms(port: int, jpeg: bytes) -> float:
    started = time.perf_counter()
    status, body = request(port, "POST", "/sketch", jpeg, {"Content-Type": "image/jpeg"})
    if status != 200:
        raise RuntimeError(f"/sketch answered {status}: {body[:300]!r}")
    return (time.perf_counter() - started) * 1000


def job_seconds(port: int, kind: str, body: dict) -> float:
    """Submit a job and wait for it: seconds from the POST to its end (succeeded only)."""
    started = time.perf_counter()
    status, answer = request(
        port, "POST", f"/jobs/{kind}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    if status != 202:
        raise RuntimeError(f"POST /jobs/{kind} answered {status}: {answer[:300]!r}")
    job_id = json.loads(answer)["id"]
    while True:
        job = json.loads(request(port, "GET", f"/jobs/{job_id}")[1])
        if job["status"] in ("succeeded", "failed", "canceled"):
            break
        time.sleep(0.02)
    if job["status"] != "succeeded":
        raise RuntimeError(f"{kind} job {job['status']}: {job.get('error')}")
    return time.perf_counter() - started


def one_start(name: str, env: dict[str, str], port: int, out: Path, jpeg: bytes, seed: int, args) -> dict:
    """Start the server, time it to ready, its first sketch and jobs, stop it."""
    log_path = out / f"server-{name}.log"
    server = spawn_server(env, port, log_path)
    try:
        ready_s, all_ready_s = wait_until_served(server, port, log_path, args.ready_timeout, poll_s=0.05)
        first_sketch = sketch_ms(port, jpeg)
        warm_sketch = statistics.median(sketch_ms(port, jpeg) for _ in range(5))
        result = {"ready_s": ready_s, "all_ready_s": all_ready_s, "sketch_ms": (first_sketch, warm_sketch)}
        text = corpus_text(args.corpus_mb, seed)
        status, answer = request(port, "POST", f"/corpora?name=start-{seed}", text)
        if status != 201:
            raise RuntimeError(f"POST /corpora answered {status}: {answer[:300]!r}")
        corpus = json.loads(answer)["id"]
        search = {"corpus_id": corpus, "patterns": ["that was", "the of"], "positions": "none"}
        jobs = {**JOBS, f"search {args.corpus_mb} MiB": ("search", search)}
        for label, (kind, body) in jobs.items():
            if args.kinds and kind not in args.kinds:
                continue
            result[label] = (job_seconds(port, kind, body), job_seconds(port, kind, body))
        return result
    finally:
        stop_server(server)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", default="fresh,restart", help="comma-separated: fresh, restart [both]")
    parser.add_argument("--processes", type=int, default=0, help="PENCIL_PROCESSES [0: the shipped default]")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server, repeatable")
    parser.add_argument("--kinds", default="", help="only these job kinds (comma-separated) [all]")
    parser.add_argument("--corpus-mb", type=int, default=CORPUS_MB, help=f"the search corpus [{CORPUS_MB}]")
    parser.add_argument("--drop-page-cache", action="store_true", help="before the fresh start (root only)")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=None, help="start.json and the server logs here")
    args = parser.parse_args(argv)
    args.kinds = {k for k in args.kinds.split(",") if k}
    out = args.out or Path(tempfile.mkdtemp(prefix="pencil-start-"))
    out.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="pencil-start-state-"))  # caches and data, fresh for this run
    env = {
        **os.environ,
        "PENCIL_ADMIN_TOKEN": TOKEN,
        "PENCIL_PROCESSES": str(args.processes),
        "PENCIL_DATA_DIR": str(state / "data"),
        "CUPY_CACHE_DIR": str(state / "cupy-cache"),
        "CUDA_CACHE_PATH": str(state / "cuda-cache"),
        # the checkout first, then whatever the caller's path holds (gpu_session.sh's carried wheels)
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    env.update(dict(item.split("=", 1) for item in args.env))
    jpeg, port = photo_jpeg(), free_port()
    results = {}
    try:
        for index, name in enumerate(s for s in args.starts.split(",") if s):
            if name == "fresh" and args.drop_page_cache:
                subprocess.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"], check=False)
            results[name] = one_start(name, env, port, out, jpeg, index, args)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    (out / "start.json").write_text(json.dumps(results, indent=2))
    print(f"{'':<22}" + "".join(f"{name:>24}" for name in results))
    labels = [key for key in next(iter(results.values()), {})]
    for label in labels:
        cells = []
        for result in results.values():
            value = result.get(label)
            if isinstance(value, float):
                cells.append(f"{value:>22.2f} s")
            elif label == "sketch_ms":
                cells.append(f"{value[0]:>9.1f} / {value[1]:.1f} ms ({value[0] / value[1]:.1f}x)".rjust(24))
            else:
                cells.append(f"{value[0]:>9.2f} / {value[1]:.2f} s ({value[0] / value[1]:.1f}x)".rjust(24))
        print(f"{label:<22}" + "".join(cells))
    print(f"(first / warm; logs and start.json in {out})")


if __name__ == "__main__":
    main()
