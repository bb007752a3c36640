"""POST /sketch on the CUDA backend: the service picks the GPU pipeline, shows its pool in
/healthz and /metrics, and draws what the CPU reference draws. CUDA only (marker `gpu`)."""

from __future__ import annotations

import numpy as np
import pytest
from pencil_testkit import decoded, metric_value, photo_bytes, sketch_files

from gpu.backend import cuda_devices
from gpu.pencil import reference
from gpu.pencil.params import PencilParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")]


def test_health_shows_the_cuda_backend_and_its_pool(make_client):
    client = make_client(backend="cuda")
    health = client.get("/healthz").json()
    assert health["backend"] == "cuda"
    assert [row["device"] for row in health["gpus"]] == list(range(len(cuda_devices())))
    assert all(row["leases"] == 4 and row["leases_in_use"] == 0 for row in health["gpus"])


@pytest.mark.parametrize("texture", ["fast", "lu"])
@pytest.mark.parametrize("mode", ["gray", "color"])
def test_sketch_renders_on_the_gpu_like_the_reference(make_client, texture, mode):
    client = make_client(backend="cuda")
    upload = photo_bytes("chelsea", "png", 451)
    response = client.post(
        "/sketch", files=sketch_files(upload, "cat.png", "image/png"), data={"texture": texture, "mode": mode}
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-backend"] == "cuda"
    got = decoded(response.content)
    expected = reference.render(decoded(upload), PencilParams(texture=texture, mode=mode))
    difference = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert got.shape == expected.shape
    assert difference.mean() <= 1.0 and (difference <= 2).mean() >= 0.99

    metrics = client.get("/metrics").text
    assert (
        sum(
            metric_value(metrics, "pencil_gpu_leases_granted_total", device=str(d)) or 0
            for d in range(len(cuda_devices()))
        )
        >= 1
    )
