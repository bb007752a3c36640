"""Batch jobs on the CUDA backend: SVD jobs run on batch-priority GPU leases (our
Golub-Reinsch, cuSOLVER through CuPy, and auto choosing between them) while sketches keep
being answered. CUDA only (marker `gpu`)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from pencil_testkit import photo_bytes, sketch_files

from gpu.backend import cuda_devices
from gpu.svd.params import make_matrix

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")]

TOKEN = "gpu-test-token"


def admin(make_client, **overrides):
    client = make_client(backend="cuda", admin_token=TOKEN, **overrides)
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    return client


def run_job(client, body: dict, wait_s: float = 120.0) -> dict:
    """Submit, poll until finished, return GET /jobs/{id}/result."""
    response = client.post("/jobs/svd", json=body)
    assert response.status_code == 202, response.text
    job_id, deadline = response.json()["id"], time.monotonic() + wait_s
    while (job := client.get(f"/jobs/{job_id}").json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["status"] == "succeeded", job
    return client.get(f"/jobs/{job_id}/result").json()


@pytest.mark.parametrize("method", ["cusolver", "golub_reinsch", "auto"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_svd_jobs_run_on_the_gpu(make_client, method, dtype):
    from gpu.svd import auto_gpu_method

    client = admin(make_client)
    spec = {"m": 300, "n": 200, "dtype": dtype, "seed": 3, "kind": "ill_conditioned", "cond": 1e4}
    result = run_job(client, {"spec": spec, "method": method})
    body = result["result"]
    expected_method = auto_gpu_method(300, 200, np.dtype(dtype)) if method == "auto" else method
    assert (body["method"], body["backend"]) == (expected_method, "cuda")
    if method == "golub_reinsch":
        assert {"bidiagonalization", "diagonalization"} <= body["times_ms"].keys()
    expected = np.linalg.svd(
        make_matrix(300, 200, np.dtype(dtype), 3, "ill_conditioned", cond=1e4).astype(np.float64), compute_uv=False
    )
    np.testing.assert_allclose(
        body["singular_values"], expected, rtol=1e-3 if dtype == "float32" else 1e-10, atol=1e-6 * expected[0]
    )
    assert max(body["accuracy"].values()) <= 35


def test_jobs_and_sketches_share_the_gpus(make_client):
    client = admin(make_client, job_streams=2)
    statuses: list[int] = []

    def sketches() -> None:
        for _ in range(6):
            statuses.append(client.post("/sketch", files=sketch_files(photo_bytes("coffee", "jpeg", 256))).status_code)

    thread = threading.Thread(target=sketches)
    thread.start()
    results = [run_job(client, {"spec": {"m": 256, "n": 256, "seed": i}, "method": "cusolver"}) for i in range(6)]
    thread.join()
    assert statuses == [200] * 6
    assert all(r["result"]["backend"] == "cuda" for r in results)
    gpus = client.get("/healthz").json()["gpus"]
    assert sum(row["leases_granted"] for row in gpus) >= 12


def test_golub_reinsch_on_the_gpu_takes_matrices_the_cpu_reference_refuses(make_client):
    """On the CPU, golub_reinsch is capped at 512 columns (a Python bulge chase); the GPU
    has no such cap. An uploaded 700 x 600 float32 matrix: U, S, V^T pass LAPACK's ratios."""
    import io

    client = admin(make_client)
    a = make_matrix(700, 600, np.float32, 11, "gaussian")
    buffer = io.BytesIO()
    np.save(buffer, a)
    response = client.post(
        "/jobs/svd",
        files={"matrix": ("a.npy", buffer.getvalue(), "application/octet-stream")},
        data={"params": json.dumps({"method": "golub_reinsch"})},
    )
    assert response.status_code == 202, response.text
    job_id, deadline = response.json()["id"], time.monotonic() + 120
    while (job := client.get(f"/jobs/{job_id}").json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["status"] == "succeeded", job
    body = client.get(f"/jobs/{job_id}/result").json()["result"]
    assert body["method"] == "golub_reinsch" and max(body["accuracy"].values()) <= 35
    files = {
        name: np.load(io.BytesIO(client.get(f"/jobs/{job_id}/files/{name}").content))
        for name in ("u.npy", "s.npy", "vt.npy")
    }
    np.testing.assert_allclose(
        (files["u.npy"].astype(np.float64) * files["s.npy"]) @ files["vt.npy"], a, atol=1e-3 * np.abs(a).max()
    )
